"""What the runtime may ask of the tables: the one module of `sharding/` that `runtime/` imports
besides the package's public names (`from tfdist_trainer import sharding`).

Why one face: the table kinds (`fixed/`, `dynamic/`) and the keras-rs bridge change inside
(an eviction policy, a column-wise split) without the runtime knowing; each question the
runtime has of them is answered here, once, for every kind. A new question is a new name
in this module, so what the runtime depends on stays listed in one place (the import
contract `sharding-face` in pyproject.toml refuses a deeper import from `runtime/`).
"""

from __future__ import annotations

from typing import Any

from tfdist_trainer.sharding.checkpoint_mismatch import table_kind_mismatch
from tfdist_trainer.sharding.dynamic.checkpoint import DynamicTableCheckpoint
from tfdist_trainer.sharding.dynamic.embedding import refuse_jit_compile
from tfdist_trainer.sharding.fixed.checkpoint import LogicalTableCheckpoint
from tfdist_trainer.sharding.fixed.restore import restore_follows, restored_apart
from tfdist_trainer.sharding.placement import task_of
from tfdist_trainer.sharding.reports import whole_reads

__all__ = [
    "is_fixed_table_checkpoint",
    "is_table_checkpoint",
    "refuse_jit_compile",
    "restore_follows",
    "restored_apart",
    "table_kind_mismatch",
    "task_of",
    "whole_reads",
]


def is_table_checkpoint(trackable: Any) -> bool:
    """Whether `trackable` is a table as checkpoints hold it, of either kind: a fixed table (or an
    optimizer slot's table) as row slices, or a dynamic table as keys and rows."""
    return isinstance(trackable, LogicalTableCheckpoint | DynamicTableCheckpoint)


def is_fixed_table_checkpoint(trackable: Any) -> bool:
    """Whether `trackable` is a fixed table saved as row slices (`copy_slice` reads one)."""
    return isinstance(trackable, LogicalTableCheckpoint)
