"""A sharded table in a checkpoint: N shard variables saved as slices of one logical [vocab, dim] tensor.

Checkpoints hold the *logical* table, never the shards, so a checkpoint
restores into any number of shards, ps tasks and either partition strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding.layout import ShardLayout

#: Bytes per checkpoint slice when a table is saved in "mod" layout (bounded memory per slice).
CHECKPOINT_SLICE_BYTES = 64 << 20


class LogicalTableCheckpoint(tf_compat.sliced_tensor_trackable()):
    """Saves N shard variables as slices of one logical [vocab, dim] tensor; restores into any layout.

    "div" shards are contiguous row ranges: each is saved as its own slice,
    without a copy. "mod" shards interleave rows, so the table is saved in
    slices of consecutive logical rows gathered from all shards. TensorFlow's
    checkpoint reader assembles whatever slices a restore asks for from the
    slices that were saved (as it does for a ShardedVariable), so the shard
    count, the ps count and the partition strategy may all change between
    save and restore.
    """

    checkpoint_key = "table"

    def __init__(self, variables_fn, layout: ShardLayout, dim: int, dtype: tf.DType, name: str):
        self._variables_fn = variables_fn
        self._layout = layout
        self._dim = dim
        self.checkpoint_dtype = dtype
        self._name = name
        #: While True, a restore reads only the table's first row and assigns nothing: the table
        #: is restored apart, a slice at a time (`fixed/restore.py`), after the rest of the checkpoint.
        self.restored_apart = False

    @property
    def shape(self) -> tuple[int, int]:
        """The logical table's [vocab, dim]."""
        return self._layout.vocab, self._dim

    def slice_spec(self, start: int, rows: int) -> str:
        return tf.Variable.SaveSliceInfo(
            full_name=self._name,
            full_shape=[self._layout.vocab, self._dim],
            var_offset=[start, 0],
            var_shape=[rows, self._dim],
        ).spec

    def slices(self) -> list[tuple[int, int, Any]]:
        """(first logical row, rows, device) of each saved slice, in save order."""
        variables = self._variables_fn()
        layout = self._layout
        if layout.partition_strategy == "div":
            return [(layout.offset(i), layout.rows(i), v.device) for i, v in enumerate(variables)]
        step = max(1, CHECKPOINT_SLICE_BYTES // max(1, self._dim * self.checkpoint_dtype.size))
        return [
            (s, min(layout.vocab, s + step) - s, variables[(s // step) % len(variables)].device)
            for s in range(0, layout.vocab, step)
        ]

    def checkpoint_slices(self) -> list[tuple[str, Any]]:
        """(slice spec, device) of each saved slice, in save order."""
        if self.restored_apart:  # the restore learns the key (checkpoint_name) and reads one row
            return [(self.slice_spec(0, 1), self._variables_fn()[0].device)]
        return [(self.slice_spec(start, rows), device) for start, rows, device in self.slices()]

    def restore_slice(self, prefix: str, index: int) -> None:
        """Restores saved slice `index` (`slices()`) from checkpoint `prefix` (key
        `checkpoint_name`): read on its shard's device (a ps reads its own rows from storage),
        assigned, and finished before this returns, so a loop over the slices holds one at a
        time."""
        start, rows, device = self.slices()[index]
        with tf.device(device):
            tensor = self._read_rows(prefix, start, rows)
        for variable, _ in self._assign_slice(index, tensor):
            _finished(variable)

    def _read_rows(self, prefix: str, first: int, rows: int) -> tf.Tensor:
        return tf.raw_ops.RestoreV2(
            prefix=prefix,
            tensor_names=[self.checkpoint_name],
            shape_and_slices=[self.slice_spec(first, rows)],
            dtypes=[self.checkpoint_dtype],
        )[0]

    def _mod_pieces(self, start: int, end: int):
        """For logical rows [start, end) in "mod" layout: (shard, offset in block, first local row, count)."""
        n = self._layout.num_shards
        for i in range(n):
            first = start + (i - start) % n  # the first logical row >= start held by shard i
            if first < end:
                yield i, first - start, first // n, (end - 1 - first) // n + 1

    def read_slice(self, index: int) -> tf.Tensor:
        variables = self._variables_fn()
        start, rows, device = self.slices()[index]
        with tf.device(device):
            if self._layout.partition_strategy == "div":
                v = variables[index]
                return tf.identity(
                    v.read_value_no_copy() if hasattr(v, "read_value_no_copy") else v.read_value()
                )
            n = self._layout.num_shards
            positions, parts = [], []
            for shard, offset, local, count in self._mod_pieces(start, start + rows):
                positions.append(tf.range(offset, rows, n))
                parts.append(tf.gather(variables[shard], tf.range(local, local + count)))
            return tf.dynamic_stitch(positions, parts)

    def copy_slice(self, index: int) -> tf.Tensor:
        """A copy of saved slice `index`, taken at once, that training's updates never wait on
        after: what a background write saves while training goes on.

        `read_slice` reads a "div" shard without a copy, for a save that training waits for;
        held while training goes on, that buffer would be copied whole by the next update of
        the shard, in the training step. Here the shard is read in copy-on-read mode (a
        one-row gather first puts it there: TF switches a variable to it on a sparse access;
        a dense read then copies), so the copy is made by this read, under the variable's
        shared lock, and is the only one. A "mod" slice is gathered from its shards: a copy.
        """
        if self._layout.partition_strategy != "div":
            return self.read_slice(index)
        variable = self._variables_fn()[index]
        _, rows, device = self.slices()[index]
        with tf.device(device):
            sparse_access = [tf.gather(variable, [0])] if rows else []
            with tf.control_dependencies(sparse_access):
                return tf.identity(variable.read_value())

    def restore_slices(self, tensors: Sequence[tf.Tensor]) -> tf.Operation:
        if self.restored_apart:
            return tf.no_op()
        return tf.group(
            [
                op
                for index, tensor in enumerate(tensors)
                for _, op in self._assign_slice(index, tensor)
            ]
        )

    def _assign_slice(self, index: int, tensor: tf.Tensor) -> list[tuple[Any, Any]]:
        """Assigns saved slice `index` from `tensor`: [(variable updated, its update op)]."""
        variables = self._variables_fn()
        if self._layout.partition_strategy == "div":  # slice i is shard i
            variable = variables[index]
            with tf.device(variable.device):
                return [(variable, variable.assign(tensor, read_value=False))]
        start, rows, _ = self.slices()[index]
        n = self._layout.num_shards
        updates = []
        for shard, offset, local, count in self._mod_pieces(start, start + rows):
            variable = variables[shard]
            with tf.device(variable.device):
                update = variable.scatter_update(
                    tf.IndexedSlices(
                        tensor[offset::n], tf.range(local, local + count, dtype=tf.int64)
                    )
                )
            updates.append((variable, update))
        return updates


def _finished(variable: Any) -> None:
    """Returns once every update sent to `variable` is done. Eager ops on another task are
    dispatched without waiting, so a loop of slice restores would otherwise have several slices
    in a ps's memory at once; a one-element read, brought here, waits for them."""
    with tf.device(variable.device):
        tf.gather(tf.reshape(variable[:1], [-1]), [0]).numpy()
