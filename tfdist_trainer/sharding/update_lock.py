"""One lock per table shard that several workers update: each optimizer update of it runs whole.

Why: under parameter_server every worker applies its own updates to the ps's
tables, whenever its step ends, so two workers' updates of one shard run at
the same time. An optimizer's update is a read-modify-write (Adagrad reads a
row of its accumulator and of the table, computes, and writes both back;
Keras' Adam reads its moments before it writes them), and two updates that
interleave lose one of them whole. Measured without a lock: 4 threads updating
the same 4,096 rows lost 20-25% of the accumulator's updates; 4 workers on a
real cluster 38-44%. TF's own scatters and fused kernels lose almost nothing
only because each one is a single kernel; a whole update is a sequence of them.

So a shard that may be updated concurrently gets a `tf.CriticalSection` on its
own device (`guard`), and the re-shardable optimizers run every update of it
inside (`ReshardableOptimizerMixin.update_step`): the lock and the update are
ops of the ps that holds the shard, so nothing crosses the network for it, and
updates of different shards never wait for each other. `SparseAdagrad`'s
sparse update takes TF's fused kernel with ``use_locking=True`` instead, which
holds the variables' own locks for the whole update at less cost. A dynamic
table's pool has a lock of its own, apart from its shard's critical section
(the step that looks keys up and gives new keys rows): a row a new key took is
drawn anew under the pool's lock by its first read, never in the middle of an
update, and an update leaves out the rows given to another key since its step
looked them up (`DynamicTableShard.current_rows`). One lock for both hung 2
workers within 40 steps (TF 2.21), as did taking the pool's lock inside the
shard's section.

Cost: a lock and an unlock per shard and update. In one process the CPU of an
update was the same with the lock; on the click benchmark's ps its 52 locked
updates a step cost about 7 ms of CPU (BUILD.md, "Update semantics"), which is
why `SparseAdagrad` takes the fused kernel instead. Contended updates of one
shard wait for each other instead of overwriting each other. Where one update runs at a time
(one_device, mirrored, multi_worker_mirrored: one update per step, after the
all-reduce) no lock is made.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat


class UpdateLock:
    """A critical section on one variable's device: `run(update)` returns once all of `update`'s
    effects are done.

    Made when first used, not when the table is: a Keras variable made inside a
    `StatelessScope` (Keras builds subclassed models that way) has no storage, and so
    no device, yet.
    """

    def __init__(self, variable: Any):
        self._variable = variable
        self._section: tf.CriticalSection | None = None

    def run(self, update: Callable[[], Any]) -> tf.Tensor:
        """Runs `update()` (an optimizer's update of the variable) under the lock; returns a
        tensor computed once the update is done and the lock released."""
        return self._made().execute(
            lambda: _all_effects_of(update), exclusive_resource_access=False
        )

    def read(self, read: Callable[[], tf.Tensor]) -> tf.Tensor:
        """`read()`'s tensor, computed under the lock (`read` waits on its own writes, if any)."""
        return self._made().execute(read, exclusive_resource_access=False)

    def _made(self) -> tf.CriticalSection:
        if self._section is None:
            device = tf_compat.variable_storage(self._variable).device
            with tf.init_scope(), tf.device(device):
                # A name of its own: critical sections made eagerly under one name share a mutex.
                self._section = tf.CriticalSection(
                    name="table_update", shared_name=f"tfdist_table_update_{uuid.uuid4().hex}"
                )
        return self._section


def _all_effects_of(update: Callable[[], Any]) -> tf.Tensor:
    """Calls `update`; returns a tensor that depends on every stateful op it made.

    A critical section releases its lock once the tensors `fn` returns are
    computed, and an optimizer's update returns nothing: its writes (Adagrad's
    accumulator and table) depend on no common output, so without this the
    lock could be released before one of them ran (measured: 1.5-4% of the
    accumulator's updates lost with only the table's write waited for).
    """
    if tf.executing_eagerly():
        update()  # each op has run when its Python call returns
        return tf.constant(0)
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    update()
    made = [op for op in graph.get_operations()[first:] if op.op_def.is_stateful]
    with tf.control_dependencies(made):
        return tf.constant(0)


def guard(variable: Any) -> None:
    """Gives `variable` (a Keras variable of a table shard) a lock of its own for its updates."""
    variable._tfdist_update_lock = UpdateLock(variable)


def lock_of(variable: Any) -> UpdateLock | None:
    """The lock `guard` gave `variable`, or None: its updates never run concurrently."""
    return getattr(variable, "_tfdist_update_lock", None)


def on_device_of(variable: Any, gradient: Any) -> Any:
    """`gradient`, read onto `variable`'s device before the lock is taken.

    Why: the lock's acquisition waits for every input of the update (TF's critical
    section adds them as its control inputs), and that extra consumer let TF's placer
    put Keras' all-reduce `Identity` of a table's gradient on the worker: each shard's
    rows then went from the ps to the worker and back (the click benchmark: 1,525 ->
    2,490 KiB to the ps a step, 0.66x the steps/s). Read here on the ps, the gradient
    stays where the grouped lookup split it.
    """
    with tf.device(variable.device):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(gradient.values), tf.identity(gradient.indices), gradient.dense_shape
            )
        return tf.identity(gradient)
