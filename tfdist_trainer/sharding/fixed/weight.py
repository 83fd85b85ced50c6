"""One logical [vocab, dim] table held as N ordinary shard variables of a Keras layer: `ShardedWeight`.

Why not `variable_partitioner`: under parameter_server it turns a layer's
variable into a `ShardedVariable`, which Keras 3 cannot differentiate
(docs/design.md). A sharded weight reads its table with one gather per shard, so
only the rows a batch needs cross the network, and gradients are
`tf.IndexedSlices`.

Under mirrored / multi_worker_mirrored every replica holds every shard, so
the lookup gathers every id from every shard (masked): each shard's
IndexedSlices gradient then has the same size on every replica and every
step, which TF 2.21's all-gather needs inside the Trainer's `tf.while_loop`
("Shape mismatch in the collective instance").

Inside an XLA compile (`jit_compile`) the lookup is that masked one, each distinct
id once and every shape fixed by the ids' (`ShardedWeight.gather`): XLA cannot
compile the split by shard. The eager and graph lookups are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding import update_lock
from tfdist_trainer.sharding.fixed.checkpoint import LogicalTableCheckpoint
from tfdist_trainer.sharding.fixed.restore import tables_start_as_zeros
from tfdist_trainer.sharding.initializers import shard_initializer
from tfdist_trainer.sharding.layout import ShardLayout
from tfdist_trainer.sharding.placement import (
    create_on,
    is_parameter_server,
    placement_ledger,
    ps_devices,
)


def _synchronous_replicas() -> int:
    """Replicas whose gradients are all-reduced each step (1 under parameter_server: no all-reduce)."""
    strategy = tf.distribute.get_strategy()
    if is_parameter_server(strategy):
        return 1
    return strategy.num_replicas_in_sync


class ShardedWeight:
    """N shard variables of one logical [vocab, dim] table, owned by a Keras layer."""

    def __init__(
        self,
        layer: keras.layers.Layer,
        name: str,
        layout: ShardLayout,
        dim: int,
        initializer: Any,
        devices: Sequence[str] | None,
        dtype: Any,
        trainable: bool = True,
    ):
        strategy = tf.distribute.get_strategy()
        self.layout = layout
        self.dim = dim
        self.key = f"{layer.name}/{name}"
        sizes = [layout.rows(i) * dim * tf.as_dtype(dtype).size for i in range(layout.num_shards)]
        candidates = list(devices) if devices else ps_devices(strategy)
        ledger = placement_ledger(strategy)
        placement = ledger.plan(sizes, candidates) if candidates else [None] * layout.num_shards
        self.variables = []
        for i, device in enumerate(placement):
            with create_on(device, strategy):
                variable = layer.add_weight(
                    name=f"{name}_shard_{i}",
                    shape=(layout.rows(i), dim),
                    # Resuming: zeros (a fill) instead of random rows a restore overwrites next.
                    initializer=(
                        "zeros" if tables_start_as_zeros() else shard_initializer(initializer, i)
                    ),
                    dtype=dtype,
                    trainable=trainable,
                )
            variable._tfdist_table = (self, i)  # read by reshardable optimizers
            if is_parameter_server(strategy):  # workers update it at once: each update whole
                update_lock.guard(variable)
            ledger.record(variable)
            self.variables.append(variable)
        self.checkpoint = LogicalTableCheckpoint(
            self.tf_variables, layout, dim, tf.as_dtype(dtype), name=self.key
        )

    def tf_variables(self) -> list:
        """The stored shard variables (inside a mixed-precision call Keras' `value` is a float16 copy)."""
        return [tf_compat.variable_storage(v) for v in self.variables]

    def flat_ids(self, ids: tf.Tensor, validate: bool = True) -> tf.Tensor:
        """`ids` (any integer shape) as one int64 vector, checked to be rows of the table."""
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise TypeError(f"{self.key}: ids must be integers, got {ids.dtype}.")
        flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
        if not validate:
            return flat
        vocab = self.layout.vocab
        with tf.control_dependencies(
            [
                tf.debugging.assert_non_negative(flat, message=f"{self.key}: ids must be >= 0"),
                tf.debugging.assert_less(
                    flat,
                    tf.constant(vocab, tf.int64),
                    message=f"{self.key}: ids must be < {vocab} (the rows)",
                ),
            ]
        ):
            return tf.identity(flat)

    def split_ids(self, ids: tf.Tensor, unique: bool = True, validate: bool = True) -> ShardIds:
        """`ids` (any shape) split by shard: what each shard reads, and how its rows go back."""
        return ShardIds(self, ids, unique, validate)

    def gather(
        self,
        ids: tf.Tensor,
        unique: bool = True,
        validate: bool = True,
        fixed_size: bool | None = None,
    ) -> tf.Tensor:
        """Rows of the logical table for `ids` (any shape) -> ids.shape + [dim]; one gather per shard.

        By default each shard is asked only for its own distinct ids, so the
        gradient of shard i has as many rows as the batch has distinct ids in
        it. With `fixed_size` (default: when more than one replica is in sync)
        every shard gathers every id (masked), so every shard's gradient has
        exactly one row per id on every replica and at every step: TensorFlow's
        all-gather of IndexedSlices between synchronous replicas fails inside a
        `tf.while_loop` (the Trainer's step loop) when their sizes change
        ("Shape mismatch in the collective instance"; TF 2.21).

        Inside an XLA compile (`jit_compile`) every shard gathers every id
        (masked), each distinct id once (`_padded_unique`), whatever the shard
        count: the split by shard (`tf.dynamic_partition`, `tf.dynamic_stitch`)
        does not compile ("Reading input as constant from a dynamic tensor is not
        yet supported"), and `tf.unique`, which does, gives a gradient of dynamic
        size whose rows `SparseAdagrad`'s update partly skips under XLA (TF 2.21).
        Each shard's gradient holds each distinct id's row once, as outside XLA
        (Keras' Adam and Adagrad square each row of an `IndexedSlices` gradient:
        an id's rows repeated would train differently), and zero rows at its row 0
        in its other slots. The ids' range checks are left out there: XLA drops
        assertions (as for a plain Keras `Embedding`, an id out of range reads a
        wrong row or zeros).
        """
        if fixed_size is None:
            fixed_size = _synchronous_replicas() > 1
        variables = self.tf_variables()
        if tf_compat.in_xla_compile():
            return self._masked_gather(ids, variables, unique and not fixed_size, validate=False)
        if not fixed_size or len(variables) == 1:
            split = self.split_ids(ids, unique and not fixed_size, validate)
            return split.rows([tf_compat.sparse_read(v, p) for v, p in zip(variables, split.local)])
        return self._masked_gather(ids, variables, False, validate)

    def _masked_gather(
        self, ids: tf.Tensor, variables: list, unique: bool, validate: bool
    ) -> tf.Tensor:
        """Every shard gathers one row per id (per distinct id with `unique`), another shard's id
        at local row 0, masked to zeros: shapes fixed by the ids' alone, the same on every
        replica and at every step, and compilable by XLA."""
        ids = tf.convert_to_tensor(ids)
        flat, used = self.flat_ids(ids, validate), None
        if unique:
            flat, used, slots = _padded_unique(flat)
        shard, local = self.layout.assign(flat)
        rows = None
        for i, variable in enumerate(variables):
            mine = tf.equal(shard, i) if used is None else tf.equal(shard, i) & used
            gathered = tf_compat.sparse_read(variable, tf.where(mine, local, tf.zeros_like(local)))
            part = tf.where(mine[:, None], gathered, tf.zeros_like(gathered))
            rows = part if rows is None else rows + part
        if unique:
            rows = tf.gather(rows, slots)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))


def _padded_unique(flat: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`tf.unique` of an id vector, padded to its size: (`distinct`, `used`, `slots`), where
    `distinct` holds the k distinct ids in increasing order, then zeros, `used` is True for those
    k, and `distinct[slots] == flat`.

    By sorting: every shape is the input's, where `tf.unique`'s output has a size known only at
    run time, which XLA compiles into gradients that `SparseAdagrad` updates wrongly (`gather`).
    """
    size = tf.size(flat)
    order = tf.argsort(flat, stable=True)
    ordered = tf.gather(flat, order)
    firsts = tf.concat([tf.ones([1], tf.bool), tf.not_equal(ordered[1:], ordered[:-1])], 0)
    firsts = firsts[:size]  # an empty batch: no first
    ordered_slots = tf.cumsum(tf.cast(firsts, tf.int32)) - 1
    slots = tf.scatter_nd(order[:, None], ordered_slots, tf.shape(flat))
    used = tf.range(size) < tf.reduce_sum(tf.cast(firsts, tf.int32))
    distinct = tf.math.unsorted_segment_max(ordered, ordered_slots, size)
    return tf.where(used, distinct, tf.zeros_like(distinct)), used, slots


class ShardIds:
    """One batch of a table's ids split by shard: `local[i]`, the rows shard i reads, and `rows`,
    which puts the shards' rows back in the order and shape of the ids.

    With `unique`, each distinct id is read once. A one-shard table reads its ids as they are
    (no partition, no stitch).
    """

    def __init__(self, weight: ShardedWeight, ids: tf.Tensor, unique: bool, validate: bool):
        ids = tf.convert_to_tensor(ids)
        self.shape, self.dim = tf.shape(ids), weight.dim
        flat = weight.flat_ids(ids, validate)
        self.restore = None
        if unique:
            flat, self.restore = tf.unique(flat)
        n = weight.layout.num_shards
        if n == 1:
            self.positions, self.local = None, [flat]
            self.sizes = tf.reshape(tf.size(flat, out_type=tf.int32), [1])
            return
        shard, local = weight.layout.assign(flat)
        shard = tf.cast(shard, tf.int32)
        self.positions = tf.dynamic_partition(tf.range(tf.size(flat)), shard, n)
        self.local = tf.dynamic_partition(local, shard, n)
        # Counted from the values, not `tf.size` of each part: in a variant of lookup_together
        # that also stitched row numbers by these parts, the traced step saw every part's size
        # as the first's (TF 2.21's graph optimizer; a small graph does not show it).
        self.sizes = tf.math.unsorted_segment_sum(tf.ones_like(shard), shard, n)

    def rows(self, parts: list[tf.Tensor]) -> tf.Tensor:
        """The ids' rows ([*ids.shape, dim]) from each shard's rows for `local`."""
        rows = parts[0] if self.positions is None else tf.dynamic_stitch(self.positions, parts)
        if self.restore is not None:
            rows = tf.gather(rows, self.restore)
        return tf.reshape(rows, tf.concat([self.shape, [self.dim]], 0))
