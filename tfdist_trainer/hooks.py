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

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gin
from absl import logging

from tfdist_trainer import memory, storage
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

    def after_side_car_eval(self, evaluation: SideCarEvaluation) -> None:
        """Called by the evaluator side-car after each checkpoint it evaluated (never on training tasks)."""

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
        peaks = memory.peak_memory_record()
        run.log_info(
            "step %d/%d %s steps/s=%.1f examples/s=%.0f ETA=%.0fs %s%s",
            run.step,
            run.target_step,
            _format(values),
            steps_per_s,
            steps_per_s * run.trainer.global_batch_size,
            eta,
            memory.format_peak_memory(peaks),
            format_tags(run.tags),
        )
        run.record.write(
            kind="train",
            step=run.step,
            steps_per_s=steps_per_s,
            examples_per_s=steps_per_s * run.trainer.global_batch_size,
            **values,
            **peaks,
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
        # the clock starts with training, not when gin built the hook
        self._last_time = time.monotonic()

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
    """The run's one evaluation schedule: every N steps (None: only at the end) and at the end.

    Without an evaluator task the training tasks evaluate inline and record
    eval_* metrics. With one, they never evaluate (Estimator's
    train_and_evaluate): the evaluator evaluates every checkpoint, so at each
    of these steps the chief saves one for it, and the evaluator's results
    are taken into metrics.jsonl (and `run.last_eval`) as they come.
    """

    def __init__(self, every_n_steps: int | None = None):
        self.every_n_steps = every_n_steps

    def begin(self, run):
        if run.has_evaluator_task:
            run.log_info(
                "evaluation: by the evaluator task, of every checkpoint%s",
                f" (one is saved every {self.every_n_steps} steps for it)"
                if self.every_n_steps
                else "",
            )

    def after_loop(self, run, result):
        if not self._due(run.step) or run.step >= run.target_step:
            return
        if run.has_evaluator_task:
            run.checkpointer.save(run.step)  # every synchronous worker takes part
            run.take_evaluator_results()
        else:
            run.evaluate()

    def end(self, run):
        if run.has_evaluator_task:
            run.take_evaluator_results()  # the final checkpoint's come from the evaluator later
        elif run.last_eval_step != run.step:
            run.evaluate()


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


#: The record beside each best export's SavedModel (in its directory): metric, mode, value, step, checkpoint.
BEST_EXPORT_RECORD = "best_export.json"


@gin.configurable
class BestExporter(Hook):
    """Exports a SavedModel each time an eval metric reaches a new best; keeps the best `keep`.

    What Estimator's BestExporter did. Each export is ``<export_dir>/<step>/``: a
    SavedModel with a serving signature, and ``best_export.json`` beside
    ``saved_model.pb`` with the metric, its value, the step and the checkpoint
    it came from. An export appears whole or not at all (written under a
    temporary name and renamed; on gs:// and s3:// the record is written last
    and a directory without it is not an export). Only an improvement is
    exported, so the highest step is always the best model: TF Serving,
    which serves the highest version, can watch `export_dir` directly. A run
    resumed on the same model_dir keeps ranking against the exports it finds.

    Inline, the chief exports from the checkpoint of the step it just
    evaluated (train.eval_every_n_steps; the checkpoint is saved then). When
    the cluster has an evaluator task, the training tasks leave exporting to
    it: the side-car exports the checkpoint it has just evaluated, and the
    chief never waits for an export. Either way the exporter sees every
    evaluation metrics.jsonl records, so the highest-step export holds the
    best value there.

    Args:
      metric: an eval metric as in metrics.jsonl, e.g. 'eval_loss' or 'eval_accuracy'.
      mode: 'min' or 'max': which direction is better.
      keep: how many of the best exports to keep.
      export_dir: default ``<model_dir>/export/best_<metric>``.
    """

    def __init__(
        self,
        metric: str = "eval_loss",
        mode: str = "min",
        keep: int = 3,
        export_dir: str | None = None,
    ):
        if not isinstance(metric, str) or not metric:
            raise ConfigError(
                f"BestExporter.metric must name an eval metric such as 'eval_loss', got {metric!r}."
            )
        if mode not in ("min", "max"):
            raise ConfigError(f"BestExporter.mode must be 'min' or 'max', got {mode!r}.")
        _check_positive_int("BestExporter.keep", keep)
        self.metric, self.mode, self.keep, self.export_dir = metric, mode, keep, export_dir
        self._best: dict | None = (
            None  # the best record so far; loaded from export_dir at first use
        )
        self._loaded = False
        self._seen_step: int | None = None
        self._inline = True

    # -- where it runs -------------------------------------------------------------

    def begin(self, run):
        self._inline = not run.has_evaluator_task
        if not self._inline and run.cluster.is_chief:
            logging.info(
                "BestExporter(%s, %s): the evaluator task exports the best model",
                self.metric,
                self.mode,
            )

    def after_loop(self, run, result):
        self._after_inline_eval(run)

    def end(self, run):
        self._after_inline_eval(run)

    def _after_inline_eval(self, run) -> None:
        if not self._inline or run.last_eval_step is None or run.last_eval_step == self._seen_step:
            return
        self._seen_step = run.last_eval_step
        if run.last_eval_step != run.step:
            return  # evaluated weights that are gone (a NaN retry rolled them back)
        export_dir = self.directory(run.model_dir)
        value = self._value(run.last_eval)
        # Every multi_worker_mirrored worker must take part in the save below: decide together.
        if not run.agree(self._improves(value, export_dir, writer=run.cluster.is_chief)):
            return
        run.checkpointer.save(run.step)
        if run.cluster.is_chief:
            import tensorflow as tf

            self._export(
                export_dir,
                step=run.step,
                value=value,
                checkpoint=tf.train.latest_checkpoint(run.model_dir),
                export=run.export_saved_model,
            )
        else:
            self._best = {"value": value, "step": run.step}

    def after_side_car_eval(self, evaluation):
        export_dir = self.directory(evaluation.model_dir)
        value = self._value(evaluation.values)
        if self._improves(value, export_dir, writer=True):
            self._export(
                export_dir,
                step=evaluation.step,
                value=value,
                checkpoint=evaluation.checkpoint,
                export=evaluation.export,
            )

    # -- ranking and exporting ------------------------------------------------------

    def directory(self, model_dir: str) -> str:
        return self.export_dir or storage.join(model_dir, "export", f"best_{self.metric}")

    def _value(self, values: dict[str, float]) -> float:
        if self.metric not in values:
            raise ConfigError(
                f"BestExporter.metric={self.metric!r} is not an eval metric; "
                f"choose one of {sorted(values)}."
            )
        return float(values[self.metric])

    def _better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def _improves(self, value: float, export_dir: str, *, writer: bool) -> bool:
        if not self._loaded:
            self._loaded = True
            exports = self.exports(export_dir, clean=writer)
            if exports:
                self._best = exports[0]
                logging.info(
                    "BestExporter: best %s so far is %.6g (step %d, in %s)",
                    self.metric,
                    self._best["value"],
                    self._best["step"],
                    export_dir,
                )
        if not math.isfinite(value):
            return False
        return self._best is None or self._better(value, self._best["value"])

    def exports(self, export_dir: str, *, clean: bool = False) -> list[dict]:
        """The complete exports in export_dir, best first (each its record plus "path").

        With `clean`, the writer removes what an interrupted export left: a
        ``.tmp-*`` directory, or a step directory without its record.
        """
        found = []
        for name in storage.listdir(export_dir):
            path = storage.join(export_dir, name)
            record = storage.read_json(storage.join(path, BEST_EXPORT_RECORD))
            if name.isdigit() and isinstance(record, dict):
                if record.get("metric") != self.metric or record.get("mode") != self.mode:
                    raise ConfigError(
                        f"BestExporter.export_dir {export_dir} holds exports ranked by "
                        f"{record.get('metric')!r} ({record.get('mode')}), not by {self.metric!r} "
                        f"({self.mode}); pick another BestExporter.export_dir."
                    )
                found.append({**record, "path": path})
            elif clean and (name.startswith(".tmp-") or name.isdigit()):
                logging.info(
                    "BestExporter: removing %s, left by an export that did not finish", path
                )
                storage.rmtree(path)
        sign = 1.0 if self.mode == "min" else -1.0
        return sorted(found, key=lambda r: (sign * r["value"], -r["step"]))

    def _export(
        self,
        export_dir: str,
        *,
        step: int,
        value: float,
        checkpoint: str | None,
        export: Callable[[str], None],
    ) -> None:
        import tensorflow as tf

        path = storage.join(export_dir, str(step))
        previous = self._best
        record = {
            "metric": self.metric,
            "mode": self.mode,
            "value": value,
            "step": step,
            "checkpoint": checkpoint,
        }
        try:
            with storage.atomic_directory(path) as target:
                export(target)
                storage.write_json(storage.join(target, BEST_EXPORT_RECORD), record)
        except (OSError, tf.errors.OpError) as e:
            message = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
            raise StorageError(
                f"BestExporter could not write {path} ({message}); pick another "
                f"BestExporter.export_dir."
            ) from None
        self._best = record
        was = (
            f"was {previous['value']:.6g} at step {previous['step']}"
            if previous
            else "the first export"
        )
        logging.info(
            "BestExporter: new best %s=%.6g at step %d (%s); exported to %s",
            self.metric,
            value,
            step,
            was,
            path,
        )
        exports = self.exports(export_dir)
        for old in exports[self.keep :]:
            storage.remove(storage.join(old["path"], BEST_EXPORT_RECORD))  # no longer an export
            storage.rmtree(old["path"])
        logging.info(
            "BestExporter: keeping the best %d: steps %s",
            min(len(exports), self.keep),
            [r["step"] for r in exports[: self.keep]],
        )


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
