"""Hooks: small objects the training controller calls between loops.

In the spirit of Orbit actions and Keras callbacks: each hook has one job,
says how often it wants a loop to end (`every_n_steps`), and reacts in
`after_loop`. Hooks run on every training task in the same order, so hooks
that take part in collectives (checkpoints under multi_worker_mirrored) make
the same decision everywhere; only the chief writes files.

Configure them in gin, e.g.::

    NanGuard.max_retries = 2
    train.extra_hooks = [@EarlyStopping(), @ExportSavedModel(), @BestExporter()]

The evaluator side-car loads the same gin config, so it builds the same
hooks; after each checkpoint it evaluates it calls their
`after_side_car_eval` (BestExporter exports there when the cluster has an
evaluator task).
"""

from __future__ import annotations

from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.hooks.base import Hook, SideCarEvaluation, StopTraining
from tfdist_trainer.hooks.best_exporter import BEST_EXPORT_RECORD, BestExporter
from tfdist_trainer.hooks.checkpointing import CheckpointHook
from tfdist_trainer.hooks.evaluation import EvalHook
from tfdist_trainer.hooks.export import ExportSavedModel
from tfdist_trainer.hooks.nan_guard import NanGuard
from tfdist_trainer.hooks.profiler import Profiler
from tfdist_trainer.hooks.progress import ProgressLogger
from tfdist_trainer.hooks.stopping import EarlyStopping, StopAtStep

__all__ = [
    "BEST_EXPORT_RECORD",
    "BestExporter",
    "CheckpointHook",
    "EarlyStopping",
    "EvalHook",
    "ExportSavedModel",
    "Hook",
    "NanGuard",
    "Profiler",
    "ProgressLogger",
    "SideCarEvaluation",
    "StopAtStep",
    "StopTraining",
    "as_hooks",
    "default_hooks",
]


def default_hooks(
    *, log_every_n_steps: int, checkpoint_every_n_steps: int | None, eval_every_n_steps: int | None
) -> list[Hook]:
    """The hooks every run has; order matters (NaN check before any save)."""
    return [
        NanGuard(),
        ProgressLogger(every_n_steps=log_every_n_steps),
        CheckpointHook(every_n_steps=checkpoint_every_n_steps),
        EvalHook(every_n_steps=eval_every_n_steps),
    ]


def as_hooks(values: Any) -> list[Hook]:
    if isinstance(values, (Hook, type)):
        raise ConfigError(
            f"train.extra_hooks must be a list, e.g. train.extra_hooks = [@EarlyStopping()], "
            f"got {values!r}."
        )
    hooks = []
    for value in values or ():
        hook = value() if isinstance(value, type) else value
        if not isinstance(hook, Hook):
            raise ConfigError(
                f"train.extra_hooks entries must be hooks such as @EarlyStopping(), got {value!r}."
            )
        hooks.append(hook)
    return hooks
