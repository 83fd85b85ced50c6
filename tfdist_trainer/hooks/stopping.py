"""Hooks that end training before `train.train_steps`: at a step, or when a metric stops improving."""

from __future__ import annotations

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.hooks.base import Hook, StopTraining


@gin.configurable
class StopAtStep(Hook):
    """Stops when the global step reaches `last_step` (before train.train_steps)."""

    def __init__(self, last_step: int):
        checks.positive_int("StopAtStep.last_step", last_step)
        self.every_n_steps = last_step
        self.last_step = last_step

    def after_loop(self, run, result):
        if run.step >= self.last_step:
            raise StopTraining(f"StopAtStep reached step {run.step}")


@gin.configurable
class EarlyStopping(Hook):
    """Stops when an eval metric has not improved by min_delta for `patience` evaluations.

    With an evaluator task the evaluations are the evaluator's, taken at each
    train.eval_every_n_steps boundary (as Estimator's stop_if_no_decrease_hook
    read the evaluator's results): the stop comes a little after the
    evaluation that decided it.
    """

    def __init__(
        self,
        monitor: str = "eval_loss",
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
    ):
        if mode not in ("min", "max"):
            raise ConfigError(f"EarlyStopping.mode must be 'min' or 'max', got {mode!r}.")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best: float | None = None
        self.bad_evals = 0
        self._seen = 0  # evaluations of run.evaluations already judged

    def after_loop(self, run, result):
        evaluations, self._seen = run.evaluations[self._seen :], len(run.evaluations)
        for _, values in evaluations:
            self._judge(values)

    def _judge(self, values: dict[str, float]) -> None:
        if self.monitor not in values:
            raise ConfigError(
                f"EarlyStopping.monitor={self.monitor!r} is not an eval metric; "
                f"choose one of {sorted(values)}."
            )
        value = values[self.monitor]
        better = self.best is None or (
            value < self.best - self.min_delta
            if self.mode == "min"
            else value > self.best + self.min_delta
        )
        if better:
            self.best, self.bad_evals = value, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= self.patience:
            raise StopTraining(
                f"{self.monitor} has not improved on {self.best:.4f} for {self.patience} evaluations"
            )
