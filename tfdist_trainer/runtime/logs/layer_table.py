"""Placement tables, layer by layer or variable by variable: in the task's log, off the console.

A 12-block model has hundreds of placed layers; the console gets one line per
device (model_parallel's `Placement.stage_lines`) or one summary line (the
variable placement, `state.log_placement`), the log file and ``placement.json`` /
``variable_placement.json`` the whole table. The launcher's console filter
(`launch.console.LOG_ONLY_SOURCES`) knows INFO records by their source file, so the
tables are logged from this module only (keep its file name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from absl import logging

from tfdist_trainer.tables import format_table


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The table's lines: layer path left-aligned, numbers right, device left."""
    return format_table(headers, rows, left=(0, 3), indent="  ").splitlines()


def log(lines: Sequence[str]) -> None:
    """One INFO record (a table is shown whole or not at all), from this source file."""
    logging.info("%s", "\n".join(lines))
