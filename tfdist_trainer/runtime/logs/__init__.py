"""Logging with the task's role on every line, and the run's machine-readable record.

`layer_table` beside it logs the placement tables to the task's log only.
"""

from __future__ import annotations

import logging as std_logging
from collections.abc import Callable
from typing import Any

from absl import logging

from tfdist_trainer.io import storage
from tfdist_trainer.io.records import MetricsRecord, format_tags, format_values


class _RoleFormatter(std_logging.Formatter):
    def __init__(self, role: str, base: std_logging.Formatter):
        super().__init__()
        self._role = role
        self._base = base

    def format(self, record):
        return f"[{self._role}] {self._base.format(record)}"


def set_role(role: str) -> None:
    """Prefixes every absl log line of this process with ``[role]``."""
    handler = logging.get_absl_handler()
    python_handler = handler.python_handler
    base = python_handler.formatter or logging.PythonFormatter()
    if isinstance(base, _RoleFormatter):
        base = base._base
    python_handler.setFormatter(_RoleFormatter(role, base))
    logging.use_python_logging(quiet=True)  # route through the formatter above


class Summaries:
    """TensorBoard summaries under model_dir/<name>; a no-op on tasks that do not write."""

    def __init__(self, model_dir: str, enabled: bool):
        self.model_dir = model_dir
        self.enabled = enabled
        self._writers = {}

    def _writer(self, name: str):
        import tensorflow as tf

        if name not in self._writers:
            self._writers[name] = (
                tf.summary.create_file_writer(storage.join(self.model_dir, name))
                if self.enabled
                else tf.summary.create_noop_writer()
            )
        return self._writers[name]

    def scalars(self, name: str, step: int, values: dict) -> None:
        import tensorflow as tf

        if not self.enabled:
            return
        with self._writer(name).as_default(step=step):
            for key, value in values.items():
                if value is not None:
                    tf.summary.scalar(key, float(value))
        self._writer(name).flush()

    def text(self, name: str, tag: str, text: str, step: int = 0) -> None:
        import tensorflow as tf

        if not self.enabled:
            return
        with self._writer(name).as_default(step=step):
            tf.summary.text(tag, text)
        self._writer(name).flush()


def trainer_tags(trainer: Any) -> dict[str, str]:
    """The Trainer's `record_tags` (a dict or a method returning one): added to every log line and record."""
    tags = getattr(trainer, "record_tags", None)
    return dict(tags() if callable(tags) else tags or {})


def report_eval(
    metrics: dict[str, float],
    *,
    step: int,
    tags: dict[str, str],
    record: MetricsRecord,
    summaries: Summaries,
    log: Callable[..., None],
    **extra: Any,
) -> dict[str, float]:
    """Logs, records and summarizes one evaluation (inline or by the side-car); returns {eval_<name>: value}."""
    values = {f"eval_{k}": v for k, v in metrics.items()}
    log(
        "eval at step %d: %s%s",
        step,
        format_values(values),
        format_tags(tags),
    )
    record.write(kind="eval", step=step, **extra, **values, **tags)
    summaries.scalars("eval", step, metrics)
    return values
