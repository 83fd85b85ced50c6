"""What every hook is: the base class, the exception that ends training early, and what the
evaluator side-car tells hooks after each checkpoint it evaluated.

Hooks are TF-free at import: gin must know them before a task starts TensorFlow,
and what they do to the model they do through the run they are given (`Run`, hooks/run.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfdist_trainer.hooks.run import LoopResult, Run


class StopTraining(Exception):
    """Raised by a hook to end training early and cleanly (final checkpoint, evaluation)."""


class Hook:
    """Base class: override what you need."""

    #: A loop ends at every multiple of this many steps, so that after_loop sees it.
    every_n_steps: int | None = None

    def begin(self, run: Run) -> None:
        """Called once after the state is built and restored, before the first loop."""

    def after_loop(self, run: Run, result: LoopResult) -> None:
        """Called after every loop; raise StopTraining to stop."""

    def end(self, run: Run) -> None:
        """Called once after the last loop (also after StopTraining)."""

    def after_side_car_eval(self, evaluation: SideCarEvaluation) -> None:
        """Called by the evaluator side-car after each checkpoint it evaluated (never on training tasks)."""

    def next_stop(self, step: int) -> int | None:
        """The first step after `step` where a loop must end for this hook (None: none)."""
        if not self.every_n_steps:
            return None
        return (step // self.every_n_steps + 1) * self.every_n_steps

    def _due(self, step: int) -> bool:
        return bool(self.every_n_steps) and step % self.every_n_steps == 0


@dataclasses.dataclass(frozen=True)
class SideCarEvaluation:
    """What the evaluator side-car tells each hook after it evaluated one checkpoint."""

    model_dir: str
    step: int
    #: {eval_<name>: value}, as in metrics.jsonl
    values: dict[str, float]
    #: the checkpoint prefix that was evaluated
    checkpoint: str
    #: writes a SavedModel (serving signature) of the evaluated weights to a path
    export: Callable[[str], None]
