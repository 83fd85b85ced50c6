"""BestExporter: a SavedModel each time an eval metric reaches a new best, the best `keep` kept.

What Estimator's BestExporter did; see BUILD.md, Estimator users."""

from __future__ import annotations

import math
from collections.abc import Callable

import gin
from absl import logging

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError, StorageError
from tfdist_trainer.hooks.base import Hook
from tfdist_trainer.io import storage

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
        checks.positive_int("BestExporter.keep", keep)
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
        run.save_checkpoint(durable=True)  # the export reads it
        if run.cluster.is_chief:
            self._export(
                export_dir,
                step=run.step,
                value=value,
                checkpoint=run.latest_checkpoint(),
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
        except storage.write_errors() as e:
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
