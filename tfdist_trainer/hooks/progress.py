"""ProgressLogger: the progress line, train records and summaries every `log_every_n_steps`."""

from __future__ import annotations

import time

import gin

from tfdist_trainer.hooks.base import Hook
from tfdist_trainer.io.records import format_tags, format_values


def format_peak_memory(record: dict[str, float]) -> str:
    """'peak_rss=812MiB peak_gpu0=5120MiB' for the progress line."""
    return " ".join(
        f"{key[: -len('_mib')]}={value:.0f}MiB"
        for key, value in record.items()
        if key.startswith("peak_")
    )


def format_table_totals(counters: dict[str, float]) -> str:
    """' dynamic_rows=5149 admitted=5160 evicted=11 expired=0': all dynamic tables, one group.

    The counters come per table (`<table>/<counter>`) and per shard; a progress
    line with 26 tables' counters would drown the loss, so it sums the tables.
    """
    totals: dict[str, float] = {}
    for key, value in counters.items():
        table, _, counter = key.rpartition("/")
        if "/" not in table:  # <table>/<counter>, not <table>/shard_<i>/<counter>
            totals[counter] = totals.get(counter, 0.0) + value
    if not totals:
        return ""
    names = {"rows_in_use": "dynamic_rows"}
    return "".join(f" {names.get(k, k)}={v:.0f}" for k, v in totals.items())


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
        peaks = run.peak_memory()
        # A step is one optimizer update: with gradient accumulation it takes k batches.
        k = run.experiment.loop.gradient_accumulation_steps
        examples_per_s = steps_per_s * run.trainer.global_batch_size * k
        learning_rate = run.learning_rate()
        lr = {} if learning_rate is None else {"learning_rate": learning_rate}
        tables = run.table_counters()  # dynamic tables: per table and shard in the record
        table_line = format_table_totals(tables)
        run.log_info(
            "step %d/%d%s %s%s steps/s=%.1f examples/s=%.0f ETA=%.0fs %s%s%s",
            run.step,
            run.target_step,
            f" (x{k} batches)" if k > 1 else "",
            format_values(values),
            f" lr={learning_rate:.3g}" if learning_rate is not None else "",
            steps_per_s,
            examples_per_s,
            eta,
            format_peak_memory(peaks),
            table_line,
            format_tags(run.tags),
        )
        run.record.write(
            kind="train",
            step=run.step,
            steps_per_s=steps_per_s,
            examples_per_s=examples_per_s,
            **values,
            **tables,
            **lr,
            **peaks,
            **run.tags,
        )
        run.last_train = values
        run.summaries.scalars(
            "train",
            run.step,
            {
                **values,
                **tables,
                **lr,
                "steps_per_s": steps_per_s,
                "examples_per_s": examples_per_s,
            },
        )
