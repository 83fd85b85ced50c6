"""Why a checkpoint does not fit a model's tables, in one sentence: a fixed table where a dynamic one is, or the reverse.

Why it needs saying: a fixed table (`ShardedEmbedding`) is saved as row
slices of a [vocab, dim] tensor, a dynamic one (`DynamicEmbedding`) as keys
and their rows. Neither can become the other (a fixed table's row numbers are
not the raw keys a dynamic table looks up), and TensorFlow reports the
mismatch only as Python objects "not bound to checkpointed values".
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.sharding.dynamic.checkpoint import DynamicTableCheckpoint
from tfdist_trainer.sharding.fixed.checkpoint import LogicalTableCheckpoint

_FIXED_KEY = "/table/.ATTRIBUTES/table"
_DYNAMIC_KEY = "/dynamic_table/.ATTRIBUTES/keys"


def table_kind_mismatch(prefix: str, restoring: Any) -> str | None:
    """The sentence for a checkpoint whose tables are of the other kind than the model's, or None.

    `restoring` is the `tf.train.Checkpoint` that failed to restore `prefix`. The model's table
    kinds are read from its objects: TensorFlow's own message lists at most 10 of the objects
    it has no values for, in no fixed order, so a dynamic table may not be among them (a
    fixed-table checkpoint restored into the dynamic click model leaves 28 unmatched).
    """
    keys = [name for name, _ in tf.train.list_variables(prefix)]
    saved_fixed = any(_FIXED_KEY in k for k in keys)
    saved_dynamic = any(_DYNAMIC_KEY in k for k in keys)
    objects = tf.train.TrackableView(restoring).descendants()
    has_fixed = any(isinstance(o, LogicalTableCheckpoint) for o in objects)
    has_dynamic = any(isinstance(o, DynamicTableCheckpoint) for o in objects)
    if has_dynamic and saved_fixed and not saved_dynamic:
        return (
            f"{prefix} holds fixed-size tables (ShardedEmbedding, rows by id) where this model has "
            f"DynamicEmbedding tables (rows by key), and one cannot be restored as the other; "
            f"train the dynamic tables in a new model_dir."
        )
    if has_fixed and saved_dynamic and not saved_fixed:
        return (
            f"{prefix} holds DynamicEmbedding tables (rows by key) where this model has fixed-size "
            f"tables (ShardedEmbedding, rows by id), and one cannot be restored as the other; "
            f"train the fixed tables in a new model_dir."
        )
    return None
