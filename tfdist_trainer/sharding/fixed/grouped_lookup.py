"""`lookup_together(weights, ids)`: many sharded tables read with one transfer per ps task each way.

Under parameter_server, inside a step that records row gradients (the Trainer's
`compute_gradients`, `tfdist_trainer.row_gradients`), every table's distinct ids are
split by shard on the worker; each ps then receives one tensor of all the ids it
holds (and the size of each shard's part) and returns one tensor of rows. The tape
differentiates those rows, so the backward pass sends one gradient tensor per ps,
split into each shard's `tf.IndexedSlices` on the ps, where the optimizer updates
them (a ParameterServerStrategy runs each variable's update on its own device).
`benchmarks/stacked_lookup.py` measures the gain (its `group` variant): for 26 tables
on 2 ps, 1.35x steps/s and 36 -> 24 ms of cluster CPU a step (the hand-written study it
grew from: `_Send` ops from about 160 to 12 a step).

Anywhere else (other strategies, evaluation, export, a user's own tape, frozen
tables) each table reads its own rows (`ShardedWeight.gather`), as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdist_trainer import row_gradients, tf_compat
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.placement import is_parameter_server


def lookup_together(
    weights: Sequence[ShardedWeight],
    ids: Sequence[tf.Tensor],
    unique: bool | Sequence[bool] = True,
) -> list[tf.Tensor]:
    """The rows of each table for its ids (any shape -> ids.shape + [dim]), one read per ps task.

    `unique` (one value, or one per table): read each distinct id once per call.
    """
    if len(weights) != len(ids):
        raise ValueError(f"lookup_together: {len(weights)} tables but {len(ids)} id tensors.")
    uniques = [unique] * len(weights) if isinstance(unique, bool) else list(unique)
    recorder = row_gradients.active()
    stacked = [t for t, w in enumerate(weights) if recorder is not None and _stackable(w)]
    rows: list[tf.Tensor | None] = [None] * len(weights)
    for t, (weight, table_ids) in enumerate(zip(weights, ids)):
        if t not in stacked:
            rows[t] = weight.gather(table_ids, unique=uniques[t])
    if stacked:
        tables = {t: weights[t].split_ids(ids[t], uniques[t]) for t in stacked}
        parts: dict[int, list] = {t: [None] * weights[t].layout.num_shards for t in stacked}
        for (device, _, _), members in _shards_by_device(weights, stacked).items():
            read = _read_on(
                recorder,
                device,
                [(weights[t], s, tables[t].local[s], tables[t].sizes[s]) for t, s in members],
            )
            for (t, s), part in zip(members, read):
                parts[t][s] = part
        for t in stacked:
            rows[t] = tables[t].rows(parts[t])
    return rows


def _stackable(weight: ShardedWeight) -> bool:
    """Whether a table's rows are read per ps task: trainable shards, each on a ps task."""
    return is_parameter_server(tf.distribute.get_strategy()) and all(
        v.trainable and "/job:ps" in (tf_compat.variable_storage(v).device or "")
        for v in weight.variables
    )


def _shards_by_device(
    weights: Sequence[ShardedWeight], tables: Sequence[int]
) -> dict[tuple[str, int, str], list[tuple[int, int]]]:
    """(ps device, row width, dtype) -> the (table, shard) pairs there, in table order; sorted.

    Rows are stacked into one tensor per ps and per width and dtype (tables of several
    widths on one ps are one read per width).
    """
    members: dict[tuple[str, int, str], list[tuple[int, int]]] = {}
    for t in tables:
        for s, variable in enumerate(weights[t].tf_variables()):
            key = (variable.device, weights[t].dim, variable.dtype.name)
            members.setdefault(key, []).append((t, s))
    return dict(sorted(members.items()))


def _read_on(
    recorder: row_gradients.RowGradients,
    device: str,
    members: Sequence[tuple[ShardedWeight, int, tf.Tensor, tf.Tensor]],
) -> list[tf.Tensor]:
    """The rows of several shards on one ps: one ids tensor there, one rows tensor back.

    `members`: (table, shard, its ids, their count). Returns each shard's rows (split on
    the worker). The gradient at the stacked rows is split into each shard's IndexedSlices
    on the ps (`to_variables`).
    """
    sizes = tf.stack([size for _, _, _, size in members])
    stacked_ids = tf.concat([local for _, _, local, _ in members], 0)
    shards = [(weight.variables[s], weight.tf_variables()[s]) for weight, s, _, _ in members]
    with tf.device(device):
        pieces = tf.split(stacked_ids, sizes, num=len(members))

    def read_rows() -> tf.Tensor:
        with tf.device(device):
            return tf.concat(
                [tf_compat.sparse_read(stored, p) for (_, stored), p in zip(shards, pieces)], 0
            )

    def to_variables(gradient: tf.Tensor) -> list:
        with tf.device(device):
            values = tf.split(gradient, sizes, num=len(members))
        return [
            (variable, tf.IndexedSlices(v, p, tf.constant(stored.shape.as_list(), tf.int64)))
            for (variable, stored), v, p in zip(shards, values, pieces)
        ]

    rows = recorder.read(read_rows, to_variables)
    return tf.split(rows, sizes, num=len(members))
