"""Hooks: small objects the training controller calls between loops.

In the spirit of Orbit actions and Keras callbacks: each hook has one job,
says how often it wants a loop to end (`every_n_steps`), and reacts in
`after_loop`. Hooks run on every training task in the same order, so hooks
that take part in collectives (checkpoints under multi_worker_mirrored) make
the same decision everywhere; only the chief writes files.

Configure them in gin, e.g.::

    NanGuard.max_retries = 2
    train.extra_hooks = [@EarlyStopping(), @ExportSavedModel()]
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import gin
from absl import logging

from tfdist_trainer import storage
from tfdist_trainer.errors import ConfigError, NonFiniteLossError, StorageError
from tfdist_trainer.logs import format_tags

if TYPE_CHECKING:
    from tfdist_trainer import loops
    from tfdist_trainer.controller import RunContext


class StopTraining(Exception):
    """Raised by a hook to end training early and cleanly (final checkpoint, evaluation)."""


class Hook:
    """Base class: override what you need."""

    #: A loop ends at every multiple of this many steps, so that after_loop sees it.
    every_n_steps: int | None = None

    def begin(self, run: RunContext) -> None:
        """Called once after the state is built and restored, before the first loop."""

    def after_loop(self, run: RunContext, result: loops.LoopResult) -> None:
        """Called after every loop; raise StopTraining to stop."""

    def end(self, run: RunContext) -> None:
        """Called once after the last loop (also after StopTraining)."""

    def _due(self, step: int) -> bool:
        return bool(self.every_n_steps) and step % self.every_n_steps == 0


def _format(values: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in values.items())


@gin.configurable
class StopAtStep(Hook):
    """Stops when the global step reaches `last_step` (before train.train_steps)."""

    def __init__(self, last_step: int):
        _check_positive_int("StopAtStep.last_step", last_step)
        self.every_n_steps = last_step
        self.last_step = last_step

    def after_loop(self, run, result):
        if run.step >= self.last_step:
            raise StopTraining(f"StopAtStep reached step {run.step}")


@gin.configurable
class NanGuard(Hook):
    """Stops on a NaN/Inf loss naming the step, or restores the last checkpoint and retries.

    Runs before the checkpoint hook, so no checkpoint ever holds the bad state.
    """

    def __init__(self, max_retries: int = 0):
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"NanGuard.max_retries must be an integer >= 0, got {max_retries!r}.")
        self.max_retries = max_retries
        self.retries = 0

    def after_loop(self, run, result):
        if result.first_nonfinite_step is None and math.isfinite(result.loss):
            return
        step = result.first_nonfinite_step or run.step
        restored = run.checkpointer.latest_step()
        if self.retries < self.max_retries and restored is not None:
            self.retries += 1
            logging.warning(
                "loss became %s at step %d; restoring the checkpoint of step %d and retrying "
                "(%d/%d)",
                result.loss,
                step,
                restored,
                self.retries,
                self.max_retries,
            )
            run.checkpointer.restore()
            run.refresh_step()
            run.take_train_metrics()  # the rolled-back steps must not count in the next record
            result.retried = True
            return
        kept = (
            f"the last good checkpoint (step {restored}) is kept"
            if restored is not None
            else "no checkpoint was written"
        )
        retry = (
            "set NanGuard.max_retries to restore and retry"
            if not self.max_retries
            else f"raise NanGuard.max_retries (its {self.max_retries} used up)"
            if restored is not None
            else "checkpoint more often (NanGuard retries from a checkpoint)"
        )
        raise NonFiniteLossError(
            f"the training loss became NaN or Inf at step {step}; {kept}. Lower the learning rate, "
            f"check the data, or {retry}."
        )


@gin.configurable
class ProgressLogger(Hook):
    """Logs step, loss, train metrics, steps/s, examples/s and ETA; records them in metrics.jsonl."""

    def __init__(self, every_n_steps: int = 100):
        self.every_n_steps = every_n_steps
        self._last_time = None
        self._last_step = 0
        self._loss_sum, self._loss_steps = 0.0, 0

    def begin(self, run):
        self._last_time, self._last_step = time.monotonic(), run.step

    def after_loop(self, run, result):
        if getattr(result, "retried", False):
            # The rolled-back loop counts neither in the loss nor in the time of the next record.
            self._last_time, self._last_step = time.monotonic(), run.step
            self._loss_sum, self._loss_steps = 0.0, 0
            return
        self._loss_sum += result.loss * result.steps
        self._loss_steps += result.steps
        if self._due(run.step) or run.step >= run.target_step:
            self._report(run)

    def end(self, run):
        """A run stopped early (StopAtStep, EarlyStopping) still records its last steps."""
        if run.step != self._last_step and self._loss_steps:
            self._report(run)

    def _report(self, run) -> None:
        now = time.monotonic()
        steps = max(run.step - self._last_step, 1)
        steps_per_s = steps / max(now - self._last_time, 1e-9)
        self._last_time, self._last_step = now, run.step
        values = {"loss": self._loss_sum / max(self._loss_steps, 1), **run.take_train_metrics()}
        self._loss_sum, self._loss_steps = 0.0, 0
        eta = (run.target_step - run.step) / steps_per_s
        run.log_info(
            "step %d/%d %s steps/s=%.1f examples/s=%.0f ETA=%.0fs%s",
            run.step,
            run.target_step,
            _format(values),
            steps_per_s,
            steps_per_s * run.trainer.global_batch_size,
            eta,
            format_tags(run.tags),
        )
        run.record.write(
            kind="train",
            step=run.step,
            steps_per_s=steps_per_s,
            examples_per_s=steps_per_s * run.trainer.global_batch_size,
            **values,
            **run.tags,
        )
        run.last_train = values
        run.summaries.scalars(
            "train",
            run.step,
            {
                **values,
                "steps_per_s": steps_per_s,
                "examples_per_s": steps_per_s * run.trainer.global_batch_size,
                "learning_rate": run.learning_rate(),
            },
        )


@gin.configurable
class CheckpointHook(Hook):
    """Saves every N steps and/or every T seconds, and at the end."""

    def __init__(self, every_n_steps: int | None = 1000, every_n_seconds: float | None = None):
        if every_n_steps is not None:
            _check_positive_int("train.checkpoint_every_n_steps", every_n_steps)
        if every_n_seconds is not None and (
            isinstance(every_n_seconds, bool)
            or not isinstance(every_n_seconds, (int, float))
            or every_n_seconds <= 0
        ):
            raise ConfigError(
                f"CheckpointHook.every_n_seconds must be a positive number of seconds or None, "
                f"got {every_n_seconds!r}."
            )
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self._last_time = time.monotonic()

    def begin(self, run):
        self._last_time = (
            time.monotonic()
        )  # the clock starts with training, not when gin built the hook

    def after_loop(self, run, result):
        by_time = (
            bool(self.every_n_seconds)
            and time.monotonic() - self._last_time >= self.every_n_seconds
        )
        # Every multi_worker_mirrored worker must take part in a save: agree on time-based ones.
        if self._due(run.step) or run.agree(by_time):
            run.checkpointer.save(run.step)
            self._last_time = time.monotonic()

    def end(self, run):
        run.checkpointer.save(run.step)


@gin.configurable
class EvalHook(Hook):
    """Evaluates every N steps (None: only at the end) and records eval_* metrics."""

    def __init__(self, every_n_steps: int | None = None):
        self.every_n_steps = every_n_steps

    def after_loop(self, run, result):
        if self._due(run.step) and run.step < run.target_step:
            run.evaluate()

    def end(self, run):
        if run.last_eval_step != run.step:
            run.evaluate()


@gin.configurable
class EarlyStopping(Hook):
    """Stops when an eval metric has not improved by min_delta for `patience` evaluations."""

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
        self._seen_step = None

    def after_loop(self, run, result):
        if run.last_eval_step is None or run.last_eval_step == self._seen_step:
            return
        self._seen_step = run.last_eval_step
        if self.monitor not in run.last_eval:
            raise ConfigError(
                f"EarlyStopping.monitor={self.monitor!r} is not an eval metric; "
                f"choose one of {sorted(run.last_eval)}."
            )
        value = run.last_eval[self.monitor]
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


@gin.configurable
class ExportSavedModel(Hook):
    """Exports a SavedModel with a serving signature at the end (chief only)."""

    def __init__(self, export_dir: str | None = None):
        self.export_dir = export_dir

    def end(self, run):
        if not run.cluster.is_chief:
            return
        path = self.export_dir or storage.join(run.model_dir, "export", str(run.step))
        import tensorflow as tf

        try:
            run.export_saved_model(path)
        except (OSError, tf.errors.OpError) as e:
            message = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
            raise StorageError(
                f"ExportSavedModel could not write {path} ({message}); the checkpoint of step "
                f"{run.step} is saved; pick another ExportSavedModel.export_dir."
            ) from None


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


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}.")


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
