"""Lookup and reduction with keras-rs 0.4's `EmbedReduce` semantics: rank-1 ids unreduced; dense
ids of rank 2+, ragged and sparse ids reduced over their last dimension by the table's combiner
('sum', 'mean', 'sqrtn'), with optional per-id weights; empty rows give zeros."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.errors import ConfigError


def _ids_tensor(values: tf.Tensor) -> tf.Tensor:
    """int64 ids (Keras' Embedding casts non-integer ids to integers too; features sharing a
    table may come as int32 and int64)."""
    return tf.cast(values, tf.int64)


def flat_ids(x: Any) -> tf.Tensor:
    if isinstance(x, tf.SparseTensor):
        return _ids_tensor(x.values)
    if isinstance(x, tf.RaggedTensor):
        if x.ragged_rank != 1 or x.shape.rank != 2:
            raise ConfigError(
                f"from_keras_rs: ragged ids must be 2-D, ragged in dimension 1 (as keras-rs "
                f"asks), got shape {x.shape} with ragged_rank {x.ragged_rank}."
            )
        return _ids_tensor(x.values)
    return tf.reshape(_ids_tensor(tf.convert_to_tensor(x)), [-1])


def reduce_rows(x: Any, rows: tf.Tensor, weights: Any, combiner: str, dim: int) -> tf.Tensor:
    """One feature's looked-up `rows` (one per id, flat) -> its embedding, per keras-rs' combiner."""
    if isinstance(x, tf.SparseTensor):
        return _reduce_sparse(x, rows, weights, combiner, dim)
    if isinstance(x, tf.RaggedTensor):
        segments = tf.cast(x.value_rowids(), tf.int32)
        w = None if weights is None else _values(weights)
        return _segment_reduce(rows, w, segments, tf.cast(x.nrows(), tf.int32), combiner)
    return _reduce_dense(tf.convert_to_tensor(x), rows, weights, combiner, dim)


def _values(weights: Any) -> tf.Tensor:
    """The per-id weights of a ragged or sparse feature: its values, in the ids' order."""
    if isinstance(weights, tf.RaggedTensor):
        return weights.values
    if isinstance(weights, tf.SparseTensor):
        return weights.values
    raise ConfigError(
        f"from_keras_rs: weights of a ragged or sparse feature must be of the same kind, "
        f"got a {type(weights).__name__}."
    )


def _reduce_dense(
    ids: tf.Tensor, rows: tf.Tensor, weights: Any, combiner: str, dim: int
) -> tf.Tensor:
    rows = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
    rows.set_shape(ids.shape.concatenate([dim]))
    if ids.shape.rank == 1:  # one id per example: nothing to reduce; only 'sum' applies weights
        if weights is None or combiner != "sum":
            return rows
        return rows * _expand_to(tf.cast(weights, rows.dtype), 2)
    w = _expand_to(_weights_or_ones(weights, ids, rows.dtype), ids.shape.rank + 1)
    total = tf.reduce_sum(rows * w, axis=-2)
    return _divide(total, tf.reduce_sum(w, axis=-2), tf.reduce_sum(w * w, axis=-2), combiner)


def _weights_or_ones(weights: Any, like: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The per-id weights, or 1 for every id (keras-rs' ones_like) when none are given."""
    return tf.ones_like(like, dtype=dtype) if weights is None else tf.cast(weights, dtype)


def _expand_to(tensor: tf.Tensor, rank: int) -> tf.Tensor:
    """Trailing axes of size 1 up to `rank` (how keras-rs broadcasts weights over the rows)."""
    for _ in range(rank - tensor.shape.rank):
        tensor = tensor[..., None]
    return tensor


def _reduce_sparse(
    x: tf.SparseTensor, rows: tf.Tensor, weights: Any, combiner: str, dim: int
) -> tf.Tensor:
    """Reduces over the last dimension of a sparse [..., L] feature; absent ids count for nothing."""
    if x.shape.rank is not None and x.shape.rank < 2:
        raise ConfigError(f"from_keras_rs: sparse ids must have rank 2 or more, got {x.shape}.")
    outer = x.dense_shape[:-1]
    strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
    segments = tf.cast(tf.reduce_sum(x.indices[:, :-1] * strides, axis=1), tf.int32)
    w = None if weights is None else _values(weights)
    reduced = _segment_reduce(rows, w, segments, tf.cast(tf.reduce_prod(outer), tf.int32), combiner)
    shape = tf.concat([outer, [dim]], 0)
    out = tf.reshape(reduced, shape)
    if x.shape.rank is not None:
        out.set_shape(x.shape[:-1].concatenate([dim]))
    return out


def _segment_reduce(
    rows: tf.Tensor, weights: tf.Tensor | None, segments: tf.Tensor, count: tf.Tensor, combiner: str
) -> tf.Tensor:
    """Sums rows (times their weights) per segment (example) and applies the combiner's divisor."""
    w = _weights_or_ones(weights, segments, rows.dtype)
    total = tf.math.unsorted_segment_sum(rows * w[:, None], segments, count)
    weight_sum = tf.math.unsorted_segment_sum(w, segments, count)[:, None]
    square_sum = tf.math.unsorted_segment_sum(w * w, segments, count)[:, None]
    return _divide(total, weight_sum, square_sum, combiner)


def _divide(total: tf.Tensor, weight_sum: tf.Tensor, square_sum: tf.Tensor, combiner: str):
    if combiner == "sum":
        return total
    if combiner == "mean":
        return tf.math.divide_no_nan(total, weight_sum)
    return tf.math.divide_no_nan(total, tf.sqrt(square_sum))
