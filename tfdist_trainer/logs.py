"""Logging with the task's role on every line, and the run's machine-readable record."""

from __future__ import annotations

import json
import logging as std_logging
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from tfdist_trainer import storage


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


#: The evaluator task's own record of its evaluations, relative to model_dir (the chief and, once
#: training is done, the evaluator copy them into metrics.jsonl).
EVALUATOR_JOURNAL = storage.join("eval", "metrics.jsonl")


class MetricsRecord:
    """One JSON object per report in ``model_dir/<name>`` (JSON lines); what tests, demos and tools read.

    Object stores cannot append, so the records are kept in memory and the
    whole file is rewritten (atomically, see storage.write_text) on each
    report; the records already there are read back first, so a restarted
    chief keeps the run's history. Reports are small and come every
    log_every_n_steps, so the rewrite stays cheap.
    """

    def __init__(self, path: str, enabled: bool = True):
        self.path = path
        self.enabled = enabled
        self._text = ""
        if enabled:
            storage.makedirs(storage.dirname(path))
            self._text = "".join(json.dumps(r) + "\n" for r in read_records(path))

    def write(self, **fields) -> None:
        if not self.enabled:
            return
        fields.setdefault("time", time.time())
        self._text += json.dumps(fields) + "\n"
        storage.write_text(self.path, self._text)

    def records(self) -> list[dict]:
        """The records in the file, as this writer last read or wrote it."""
        return _parse(self._text)

    def add_missing(self, records: list[dict]) -> list[dict]:
        """Adds, in one rewrite, each record not there yet; returns those added.

        A record is there when one has the same kind, step and ``evaluated_by``:
        how the chief copies the evaluator's results into metrics.jsonl, and the
        evaluator the last of them, once each, whoever gets there first.
        """
        present = {_identity(r) for r in self.records()}
        added = [r for r in records if _identity(r) not in present]
        if added and self.enabled:
            self._text += "".join(json.dumps(r) + "\n" for r in added)
            storage.write_text(self.path, self._text)
        return added


def _identity(record: dict) -> tuple:
    return record.get("kind"), record.get("step"), record.get("evaluated_by")


def _parse(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line, left by an older version that appended
    return records


def read_records(path: str) -> list[dict]:
    """The records of a metrics file (a local path or any URI tf.io.gfile reads); [] when it is absent."""
    return _parse(storage.read_text(path) or "")


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


def format_tags(tags: dict[str, str]) -> str:
    return "".join(f" [{k}: {v}]" for k, v in tags.items())


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
        " ".join(f"{k}={v:.4f}" for k, v in values.items()),
        format_tags(tags),
    )
    record.write(kind="eval", step=step, **extra, **values, **tags)
    summaries.scalars("eval", step, metrics)
    return values
