"""How a dynamic table's shard frees rows: LFU eviction when it is full, and the age sweep.

Why a module of its own: the policy is what users tune and contributors
change (LRU, a TTL scorer, another chunk size), and it reads only the
shard's bookkeeping (each row's key, frequency and last sighting, the free
stack), not its hash-table step (dynamic/shard.py). A freed row's key leaves
the hash table and the row goes on the free stack; its contents are drawn
anew when a key takes it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.keys import EMPTY_KEY

#: An eviction frees at least capacity // EVICTION_CHUNK rows (least frequently used first).
EVICTION_CHUNK = 16
#: The age sweep runs every max(1, max_age_steps // AGE_SWEEP_EVERY) steps.
AGE_SWEEP_EVERY = 8

_INT64_MAX = np.iinfo(np.int64).max


def lfu_score(frequency: tf.Tensor, last_seen: tf.Tensor) -> tf.Tensor:
    """Higher for rows to keep: more frequent first, then more recently seen (one int64)."""
    return tf.minimum(frequency, 2**31 - 1) * (2**32) + tf.minimum(last_seen, 2**32 - 1)


class ShardEviction:
    """The freeing of rows, a part of `DynamicTableShard` (its variables, counters and `_remove`)."""

    def _make_room(self, n_new: tf.Tensor, clock: tf.Tensor) -> tf.Tensor:
        """LFU eviction when `n_new` rows do not fit: frees at least a chunk of the least used rows."""
        chunk = max(1, self.capacity // EVICTION_CHUNK)
        shortfall = n_new - (self.capacity - self.rows_in_use.read_value())

        def evict():
            eligible = (self.row_key.read_value() != EMPTY_KEY) & (self.last_seen < clock)
            # Least frequent first; equally frequent: least recently seen first.
            score = tf.where(
                eligible,
                lfu_score(self.frequency, self.last_seen),
                tf.constant(_INT64_MAX, tf.int64),
            )
            k = tf.minimum(
                tf.maximum(tf.constant(chunk, tf.int64), shortfall),
                tf.math.count_nonzero(eligible, dtype=tf.int64),
            )
            _, rows = tf.math.top_k(-score, k=tf.cast(k, tf.int32))
            return self._free(tf.cast(rows, tf.int64), self.evicted)

        return tf.cond(shortfall > 0, evict, lambda: tf.constant(0, tf.int64))

    def _expire(self, clock: tf.Tensor) -> tf.Tensor:
        """Frees the rows not seen for `max_age_steps` steps, every few steps (an O(capacity) sweep)."""
        if self.max_age_steps is None:
            return tf.constant(0, tf.int64)
        every = max(1, self.max_age_steps // AGE_SWEEP_EVERY)

        def sweep():
            stale = (self.row_key.read_value() != EMPTY_KEY) & (
                self.last_seen < clock - self.max_age_steps
            )
            return self._free(tf.where(stale)[:, 0], self.expired)

        return tf.cond(tf.equal(clock % every, 0), sweep, lambda: tf.constant(0, tf.int64))

    def _free(self, rows: tf.Tensor, counter: tf.Variable) -> tf.Tensor:
        """Removes the keys of `rows` and pushes the rows onto the free stack (drawn anew when taken)."""
        k = tf.size(rows, out_type=tf.int64)
        keys = tf.gather(self.row_key, rows)
        zeros = tf.zeros_like(rows)
        free = self.capacity - self.rows_in_use.read_value()
        effects = [
            self._remove("table", keys),
            self.row_key.scatter_update(tf.IndexedSlices(tf.fill([k], EMPTY_KEY), rows)),
            self.frequency.scatter_update(tf.IndexedSlices(zeros, rows)),
            self.last_seen.scatter_update(tf.IndexedSlices(zeros, rows)),
            self.free_rows.scatter_update(tf.IndexedSlices(rows, free + tf.range(k))),
        ]
        with tf.control_dependencies(effect_ops(effects)):
            effects = [self.rows_in_use.assign_sub(k), counter.assign_add(k)]
        with tf.control_dependencies(effect_ops(effects)):
            return tf.identity(k)
