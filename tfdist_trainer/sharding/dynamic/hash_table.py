"""A shard's int64 -> int64 hash table that keeps empty buckets: removals counted, rebuilt when worn.

Why rebuilt: TF's `DenseHashTable` marks a removed key's bucket "deleted" and
only an insert that probes it first reuses it, so under steady removals
(evictions, admitted candidates) empty buckets run out, and a lookup of a
missing key then probes every bucket and fails (measured: 64 buckets, at most
21 live keys, fails after 241 inserts). The table counts its removals; once
they reach a quarter of its buckets it is cleared and its live keys inserted
again (O(buckets), amortised over those removals), so at least a quarter of
the buckets stay empty.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.keys import DELETED_KEY, EMPTY_KEY


def buckets(capacity: int) -> int:
    """Hash-table buckets for `capacity` keys at a load of at most one half (no rehash while it fills)."""
    return max(16, 1 << (2 * capacity - 1).bit_length())


class KeyTable:
    """One `DenseHashTable` of int64 keys with its removal count.

    Create it under `tf.init_scope()`: the counter follows the variable creator (the shard's
    placement), the table goes under `device` (a context factory: the shard's `on_device`).
    """

    def __init__(self, *, name: str, capacity: int, default_value: int, device):
        self.name = name
        self.default_value = default_value
        #: The buckets it is made (and rebuilt) with; TF doubles them itself on a fuller insert.
        self.buckets = buckets(capacity)
        # Removals since the table was last rebuilt (not checkpointed: a restore rebuilds it).
        self.removals = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_removals")
        with device():
            self.hash_table = tf.lookup.experimental.DenseHashTable(
                tf.int64,
                tf.int64,
                default_value=default_value,
                empty_key=EMPTY_KEY,
                deleted_key=DELETED_KEY,
                initial_num_buckets=self.buckets,
                name=name,
                experimental_is_anonymous=True,
            )

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """The value of each key (`default_value` for a missing one), shaped like `keys`."""
        return tf.reshape(self.hash_table.lookup(keys), tf.shape(keys))

    def insert(self, keys: tf.Tensor, values: tf.Tensor):
        return self.hash_table.insert(keys, values)

    def size(self) -> tf.Tensor:
        return self.hash_table.size()

    def remove(self, keys: tf.Tensor) -> tf.Tensor:
        """Erases `keys`, counting the removals."""
        erased = self.hash_table.erase(keys)
        with tf.control_dependencies(effect_ops([erased])):
            return self.removals.assign_add(tf.size(keys, out_type=tf.int64))

    def live(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(keys, values) of the live entries, and the export's keys (for their shape)."""
        exported = self.hash_table.export()
        keys, values = (tf.reshape(t, [-1]) for t in exported)
        alive = keys > DELETED_KEY
        return tf.boolean_mask(keys, alive), tf.boolean_mask(values, alive), exported[0]

    def rebuild_if_worn(self) -> tf.Tensor:
        """Rebuilds the table once its removals reach a quarter of its buckets (module doc)."""

        def rebuild():
            keys, values, exported_keys = self.live()
            return self.replace(keys, values, exported_keys=exported_keys)

        # The buckets it was made with (TF may have doubled them since: then it is rebuilt early).
        worn = self.removals.read_value() * 4 >= self.buckets
        return tf.cond(worn, rebuild, lambda: tf.constant(0, tf.int64))

    def replace(self, keys: tf.Tensor, values: tf.Tensor, exported_keys: tf.Tensor | None = None):
        """Clears the table (TF's import of an all-empty bucket array: no deleted buckets left),
        then inserts `keys` -> `values`; its removal count starts again at 0.
        `exported_keys`: the table's export, when the caller has it (only its shape is read)."""
        if exported_keys is None:
            exported_keys = self.hash_table.export()[0]
        # Shaped like the table's own export ([buckets, 1] when run, of unknown rank when traced):
        # what the import kernel and its shape function each accept (as in TF's own restore).
        # Filled at run time from that shape, never a folded constant: the table keeps the
        # imported buffers as its buckets and writes into them.
        shape = tf.concat([[self.buckets], tf.shape(exported_keys)[1:]], 0)
        cleared = tf.raw_ops.LookupTableImportV2(
            table_handle=self.hash_table.resource_handle,
            keys=tf.fill(shape, tf.constant(EMPTY_KEY, tf.int64)),
            values=tf.fill(shape, tf.constant(self.default_value, tf.int64)),
        )
        with tf.control_dependencies(effect_ops([cleared])):
            inserted = self.hash_table.insert(keys, values)
        with tf.control_dependencies(effect_ops([inserted])):
            return self.removals.assign(0)
