"""All sparse gradients of a step exchanged between synchronous replicas in one all-gather.

Under multi_worker_mirrored TensorFlow reduces each `tf.IndexedSlices` gradient
on its own: an all-gather of its length, a `tf.cond` on whether the lengths
agree, an all-gather of its values and one of its indices (a length gather
and a padded gather each, `CollectiveReplicaLauncher.all_gather`). A click model
with 26 tables pays for about a hundred collectives a step, each a round trip
between workers, whatever the batch: on 2 CPU workers that, not the tables'
size, capped the step rate (issue 36).

`all_reduce_sum` instead packs every 32-bit sparse gradient of the step into
one int32 vector, [row counts | indices as int32 pairs | values' bits], gathers
that once and unpacks each replica's part: one all-gather for all tables. The
result is what TF's own reduction gives: per table, the concatenation of every
replica's rows (IndexedSlices are summed by concatenation). Dense gradients
and sparse ones of other dtypes go through `ReplicaContext.all_reduce` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

#: Dtypes packed bit for bit into the int32 vector (one int32 per value).
_PACKED_DTYPES = (tf.float32, tf.int32)


def _packable(gradient: Any) -> bool:
    return isinstance(gradient, tf.IndexedSlices) and gradient.values.dtype in _PACKED_DTYPES


def _row_width(gradient: tf.IndexedSlices) -> int:
    """Values per row (the product of the row's static shape); every table's row width is static."""
    width = 1
    for d in gradient.values.shape[1:]:
        if d is None:
            raise ValueError(
                f"a sparse gradient's row shape must be static, got {gradient.values.shape}"
            )
        width *= int(d)
    return width


def _pack(slices: Sequence[tf.IndexedSlices]) -> tf.Tensor:
    counts = tf.stack([tf.shape(s.indices, out_type=tf.int32)[0] for s in slices])
    indices = [tf.bitcast(tf.cast(s.indices, tf.int64), tf.int32) for s in slices]  # [n, 2]
    values = [
        tf.bitcast(s.values, tf.int32) if s.values.dtype != tf.int32 else s.values for s in slices
    ]
    return tf.concat(
        [counts] + [tf.reshape(i, [-1]) for i in indices] + [tf.reshape(v, [-1]) for v in values],
        axis=0,
    )


def _unpack(
    packed: tf.Tensor, slices: Sequence[tf.IndexedSlices], num_replicas: int
) -> list[tf.IndexedSlices]:
    """Splits the gathered vector (every replica's packed vector, in replica order) per table."""
    widths = [_row_width(s) for s in slices]
    num_tables = len(slices)
    parts_indices: list[list[tf.Tensor]] = [[] for _ in slices]
    parts_values: list[list[tf.Tensor]] = [[] for _ in slices]
    offset = tf.constant(0, tf.int32)
    for _ in range(num_replicas):
        counts = packed[offset : offset + num_tables]
        sizes = tf.concat([2 * counts, counts * tf.constant(widths, tf.int32)], axis=0)
        length = num_tables + tf.reduce_sum(sizes)
        pieces = tf.split(packed[offset + num_tables : offset + length], sizes, num=2 * num_tables)
        for t, s in enumerate(slices):
            parts_indices[t].append(tf.bitcast(tf.reshape(pieces[t], [-1, 2]), tf.int64))
            values = pieces[num_tables + t]
            if s.values.dtype != tf.int32:
                values = tf.bitcast(values, s.values.dtype)
            parts_values[t].append(
                tf.reshape(values, tf.concat([[-1], tf.shape(s.values)[1:]], axis=0))
            )
        offset = offset + length
    reduced = []
    for t, s in enumerate(slices):
        indices = tf.concat(parts_indices[t], axis=0)
        reduced.append(
            tf.IndexedSlices(
                tf.concat(parts_values[t], axis=0),
                tf.cast(indices, s.indices.dtype),
                s.dense_shape,
            )
        )
    return reduced


def all_reduce_sum(replica_context: tf.distribute.ReplicaContext, gradients: Sequence[Any]) -> list:
    """The replicas' gradients summed, as `replica_context.all_reduce(SUM, gradients)` gives them.

    Packs the sparse ones into one all-gather when there are at least two.
    """
    gradients = list(gradients)
    sparse = [i for i, g in enumerate(gradients) if _packable(g)]
    if len(sparse) < 2:
        return replica_context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
    reduced: list[Any] = [None] * len(gradients)
    slices = [gradients[i] for i in sparse]
    gathered = replica_context.all_gather(_pack(slices), axis=0)
    for i, g in zip(sparse, _unpack(gathered, slices, replica_context.num_replicas_in_sync)):
        reduced[i] = g
    other = [i for i in range(len(gradients)) if i not in set(sparse)]
    if other:
        dense = replica_context.all_reduce(
            tf.distribute.ReduceOp.SUM, [gradients[i] for i in other]
        )
        for i, g in zip(other, dense):
            reduced[i] = g
    return reduced
