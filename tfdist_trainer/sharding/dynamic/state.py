"""A dynamic table shard's contents as tensors, and back: what a checkpoint of the table holds.

Why apart from the shard's training step (dynamic/shard.py): a checkpoint reads
and writes every row in use at once, by keys (dynamic/checkpoint.py gathers the
shards' states into one set of tensors of any shard count); the step touches
only a batch's keys. Both run on the shard's device; a read runs in the
shard's critical section so that no training step changes the rows under it.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.keys import EMPTY_KEY
from tfdist_trainer.sharding.dynamic.shard import DynamicTableShard


def export_shard_state(shard: DynamicTableShard) -> dict[str, tf.Tensor]:
    """The shard's rows in use and its bookkeeping, as tensors on its device (for a checkpoint).

    Keys, rows, values, last_seen, the eviction policy's metadata and each
    slot's values are one entry per row in use, in row order; ``free`` is the
    free stack.
    """

    def read():
        with shard.on_device():
            used = tf.where(shard.row_key.read_value() != EMPTY_KEY)[:, 0]
            free = shard.capacity - shard.rows_in_use.read_value()
            state = {
                "keys": tf.gather(shard.row_key, used),
                "rows": used,
                "values": tf.gather(tf_compat.variable_storage(shard.pool), used),
                "last_seen": tf.gather(shard.last_seen, used),
                **{name: tf.gather(m, used) for name, m in shard.eviction.metadata.items()},
                "free": shard.free_rows[:free],
                **{
                    name: tf.reshape(getattr(shard, name).read_value(), [1])
                    for name in ("clock", "admitted", "evicted", "expired")
                },
            }
            for name, slot in shard.slots:
                state[f"slot_{name}"] = tf.gather(tf_compat.variable_storage(slot), used)
            state.update(shard.admission.export())
            return state

    return shard.exclusively(read)


def import_shard_state(shard: DynamicTableShard, state: dict[str, tf.Tensor]) -> list:
    """Replaces the shard's contents with `state` (as `export_shard_state` gives it, for this shard).

    ``rows`` must be distinct rows of this shard and ``free`` the other
    rows; the rows in use keep their values and slots, the free rows'
    contents do not matter (drawn anew when taken). Returns the updates.
    """
    with shard.on_device():
        rows, keys = state["rows"], state["keys"]
        metadata = shard.eviction.metadata
        effects = [
            shard.row_key.assign(tf.fill([shard.capacity], tf.constant(EMPTY_KEY, tf.int64))),
            *(m.assign(tf.zeros([shard.capacity], tf.int64)) for m in metadata.values()),
            shard.last_seen.assign(tf.zeros([shard.capacity], tf.int64)),
            shard.taken_at.assign(tf.zeros([shard.capacity], tf.int64)),
            shard.undrawn.assign(tf.zeros([shard.capacity], tf.bool)),
        ]
        with tf.control_dependencies(effect_ops(effects)):
            effects += [
                shard.row_key.scatter_update(tf.IndexedSlices(keys, rows)),
                shard.last_seen.scatter_update(tf.IndexedSlices(state["last_seen"], rows)),
                *(m.scatter_update(tf.IndexedSlices(state[n], rows)) for n, m in metadata.items()),
            ]
        pool = tf_compat.variable_storage(shard.pool)
        effects.append(
            pool.scatter_update(tf.IndexedSlices(tf.cast(state["values"], pool.dtype), rows))
        )
        for name, slot in shard.slots:
            if f"slot_{name}" in state:
                stored = tf_compat.variable_storage(slot)
                values = tf.cast(state[f"slot_{name}"], stored.dtype)
                effects.append(stored.scatter_update(tf.IndexedSlices(values, rows)))
        free = state["free"]
        padding = tf.zeros([shard.capacity - tf.size(free)], tf.int64)
        effects.append(shard.free_rows.assign(tf.concat([free, padding], 0)))
        effects += [shard.rows_in_use.assign(tf.size(keys, out_type=tf.int64))]
        effects += [
            getattr(shard, name).assign(tf.reshape(state[name], []))
            for name in ("clock", "admitted", "evicted", "expired")
        ]
        effects.append(shard.key_rows.replace(keys, rows))
        effects += shard.admission.restore(state)
        return effects
