"""The save a training task makes when it must exit now: what a strategy's last words need, no more.

Why not the task's `RunContext`: a strategy's runtime sits below the training task in the
import layers (parameter_server's stall save is its one user), and it needs only two
things: the checkpointer (is a checkpoint kept? does a save need the workers?) and a way to
save the steps finished so far, durably, through the task's one save path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfdist_trainer.runtime.checkpoints.checkpointer import Checkpointer


@dataclasses.dataclass(frozen=True)
class FinalSave:
    """The checkpointer, and `save()`: saves the finished steps durably, returns their step."""

    checkpointer: Checkpointer
    save: Callable[[], int]
