"""Optimizers whose checkpoints survive re-sharding: `SGD`, `SparseAdagrad`, `reshardable(cls)`.

Optimizer slots of sharded tables need an optimizer that saves them as
logical tables, as the layers save the tables. With a stock Keras optimizer
the shards are also saved, by position, under
``optimizer/_trainable_variables``, which pins the shard count.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding import update_lock
from tfdist_trainer.sharding.fixed.checkpoint import LogicalTableCheckpoint
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.saving import serializable


class ReshardableOptimizerMixin(tf_compat.ReplacesCheckpointChildren):
    """Saves optimizer slots of sharded tables as logical tables, other state by name.

    A stock Keras 3 optimizer saves its variables by position (and the model's
    variables again under ``_trainable_variables``), so a different shard count
    shifts every position. With this mixin the checkpoint holds ``iterations``,
    ``learning_rate``, each slot of a non-sharded variable under its path, and
    each slot of a sharded table as one logical [vocab, dim] table. The slots of
    a `DynamicEmbedding`'s pools are not saved here: the table saves each key's
    slot rows with the key (dynamic/checkpoint.py) and resets them when a key
    takes a row.

    Every update of a table shard that several workers update at once
    (parameter_server) runs whole under the shard's lock (`update_lock`), so
    concurrent updates of the same rows are all applied, none overwritten. A
    `DynamicEmbedding` pool's update leaves out the rows given to another key
    since the step looked its keys up (`DynamicTableShard.current_rows`).
    """

    def update_step(self, gradient, variable, learning_rate):
        # Keras hands update_step the TF variable that stores a Keras variable; the lock and
        # the dynamic shard are the Keras variable's.
        table = tf_compat.optimizer_variable(self, variable)
        lock = update_lock.lock_of(table)
        shard = getattr(table, "_tfdist_dynamic_shard", None)
        if lock is None:  # one update at a time (not a table, or not parameter_server)
            if shard is not None:  # a later call of the layer in this step may have moved rows
                gradient = shard.current_rows(gradient)
            return super().update_step(gradient, variable, learning_rate)
        gradient = update_lock.on_device_of(variable, gradient)
        if shard is None and self._holds_variable_locks(gradient):
            return self._locked_update_step(gradient, variable, learning_rate)
        lock.run(
            lambda: self._locked_update_step(
                gradient if shard is None else shard.current_rows(gradient),
                variable,
                learning_rate,
            )
        )

    def _holds_variable_locks(self, gradient) -> bool:
        """Whether the update of `gradient` holds its variables' own locks from its first read to
        its last write (a fused kernel with use_locking), so the shard's lock adds nothing."""
        return False

    def _locked_update_step(self, gradient, variable, learning_rate):
        """The optimizer's update of `variable` where other workers update it too: run whole,
        under the shard's lock or (`_holds_variable_locks`) the variables' own."""
        return super().update_step(gradient, variable, learning_rate)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        slot = super().add_variable_from_reference(
            reference_variable, name=name, initializer=initializer
        )
        slot._tfdist_slot_key = (
            f"{getattr(reference_variable, 'path', reference_variable.name)}/{name}"
        )
        table = getattr(reference_variable, "_tfdist_table", None)
        if table is not None:
            slot._tfdist_slot_of = (table, name)
        dynamic = getattr(reference_variable, "_tfdist_dynamic_shard", None)
        if (
            dynamic is not None
        ):  # a DynamicEmbedding's pool: the table saves its rows and resets them
            dynamic.register_slot(name, slot, initializer)
            slot._tfdist_dynamic_slot = True
        return slot

    def checkpoint_children(self, children: dict[str, Any]) -> dict[str, Any]:
        variables = list(self.variables)
        if not any(
            getattr(v, "_tfdist_slot_of", None) or getattr(v, "_tfdist_dynamic_slot", False)
            for v in variables
        ):
            sharded_model = any(
                getattr(v, "_tfdist_table", None) for v in tf_compat.optimizer_model_variables(self)
            )
            if not sharded_model:
                return children
        keep = tf_compat.optimizer_scalar_children(children)
        kept_ids = {id(c) for c in keep.values()}
        groups: dict[tuple[int, str], dict[int, Any]] = {}
        for variable in variables:
            if id(variable) in kept_ids or getattr(variable, "_tfdist_dynamic_slot", False):
                continue  # a dynamic table's slot rows are saved with its keys (dynamic/checkpoint.py)
            slot_of = getattr(variable, "_tfdist_slot_of", None)
            if slot_of is None:
                # By what it is, not by position or by the optimizer's own (auto-numbered) name.
                key = getattr(variable, "_tfdist_slot_key", None) or variable.path.split("/", 1)[-1]
                keep[f"var/{key}"] = variable
                continue
            (table, shard), slot_name = slot_of
            groups.setdefault((id(table), slot_name), {"table": table, "slots": {}})["slots"][
                shard
            ] = variable
        for (_, slot_name), group in groups.items():
            table: ShardedWeight = group["table"]
            slots = [group["slots"][i] for i in range(table.layout.num_shards)]
            cache = self.__dict__.setdefault("_tfdist_slot_tables", {})
            key = (id(table), slot_name, tuple(id(s) for s in slots))
            if key not in cache:  # the same object on every call: checkpoints compare identities
                stored = lambda slots=slots: [tf_compat.variable_storage(s) for s in slots]  # noqa: E731
                cache[key] = LogicalTableCheckpoint(
                    stored,
                    table.layout,
                    table.dim,
                    tf.as_dtype(slots[0].dtype),
                    name=f"{table.key}/{slot_name}",
                )
            keep[f"sharded/{table.key}/{slot_name}"] = cache[key]
        return keep


def reshardable(optimizer_cls: type) -> type:
    """A subclass of a Keras optimizer class whose checkpoints restore into other shard counts."""
    return type(
        f"Reshardable{optimizer_cls.__name__}", (ReshardableOptimizerMixin, optimizer_cls), {}
    )


@serializable
class SGD(ReshardableOptimizerMixin, keras.optimizers.SGD):
    """Keras SGD (sparse updates for IndexedSlices) with re-shardable checkpoints. No slots without momentum."""


def _summed_rows(gradient: tf.IndexedSlices, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
    """The distinct rows of a sparse gradient and each one's summed values: an update then
    writes each row once (a batch's repeated ids would otherwise be applied one by one)."""
    indices, position = tf.unique(tf.cast(gradient.indices, tf.int64))
    values = tf.math.unsorted_segment_sum(
        tf.cast(gradient.values, dtype), position, tf.shape(indices)[0]
    )
    return indices, values


class _RowAdagrad(keras.optimizers.Adagrad):
    """Keras' Adagrad, with a sparse gradient applied to its rows only (`SparseAdagrad`)."""

    def update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        lr = tf.cast(learning_rate, variable.dtype)
        accumulator = tf_compat.adagrad_accumulator(self, variable)
        accumulator, variable = (
            tf_compat.variable_storage(accumulator),
            tf_compat.variable_storage(variable),
        )
        indices, values = _summed_rows(gradient, variable.dtype)
        accumulated = tf_compat.sparse_read(accumulator, indices) + tf.square(values)
        accumulator.scatter_update(tf.IndexedSlices(accumulated, indices))
        rows = tf_compat.sparse_read(variable, indices)
        variable.scatter_update(
            tf.IndexedSlices(rows - lr * values / tf.sqrt(accumulated + self.epsilon), indices)
        )


@serializable
class SparseAdagrad(ReshardableOptimizerMixin, _RowAdagrad):
    """Adagrad that touches only the rows of an `IndexedSlices` gradient.

    Keras' Adagrad computes ``sqrt(accumulator + epsilon)`` over the whole
    table every step (O(table) work on the ps per step). Here a sparse
    gradient is first summed per distinct row, then only those rows of the
    accumulator and the table are read, computed on as one tensor, and written
    back (`scatter_update`, a copy per row). TF's `scatter_add`/`scatter_sub`
    run an Eigen expression per row instead, and took 36% of a ps's CPU in the
    click benchmark; one ps's update of a step takes 1.34x less CPU this way
    (`benchmarks/sparse_update.py`, BUILD.md).

    Exact under parameter_server: where a shard has a lock (`update_lock`: several
    workers update it), its sparse update is TF's fused
    `ResourceSparseApplyAdagradV2` with ``use_locking=True``, which holds both
    variables' locks for the whole update, so updates of the same rows from
    several workers are applied one after the other; none is lost (without a
    lock 38-44% of them were, with 4 workers on rows every batch touches). The
    fused kernel costs more CPU per row than the write-back, but less than the
    shard lock's own ops (click benchmark: BUILD.md, "Update semantics"). A
    `DynamicEmbedding` pool's fused update still runs in its shard's critical
    section, where no row is reset for a new key during it.
    """

    def _holds_variable_locks(self, gradient) -> bool:
        return isinstance(gradient, tf.IndexedSlices)

    def _locked_update_step(self, gradient, variable, learning_rate):
        if not isinstance(gradient, tf.IndexedSlices):
            return super()._locked_update_step(gradient, variable, learning_rate)
        accumulator = tf_compat.variable_storage(tf_compat.adagrad_accumulator(self, variable))
        stored = tf_compat.variable_storage(variable)
        with tf.device(stored.device):
            indices, values = _summed_rows(gradient, stored.dtype)
            tf.raw_ops.ResourceSparseApplyAdagradV2(
                var=stored.handle,
                accum=accumulator.handle,
                lr=tf.cast(learning_rate, stored.dtype),
                epsilon=tf.constant(self.epsilon, stored.dtype),
                grad=values,
                indices=indices,
                use_locking=True,
            )
