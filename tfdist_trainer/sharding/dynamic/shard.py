"""One shard of a dynamic table: a key -> row hash table, a row pool and its bookkeeping, on one device.

Why a critical section: under parameter_server several workers run the
training step at once, and "look up, give the missing keys rows, look up
again" is a read-modify-write of the shard's state. Every such step of one
shard runs inside the shard's `tf.CriticalSection`, placed with the state on
the shard's ps task, so two workers meeting the same new key in the same step
end with exactly one row for it. Lookups for inference read the hash table
only (its own mutex makes a single lookup safe) and never insert.

The state is plain: one `DenseHashTable` (key -> row), one for admission
candidates (key -> times seen) when ``min_count > 1``, and int64 variables of
``capacity`` entries (the row's key, its frequency, the step it was last
seen, a stack of free rows) plus scalar counters. Every row belongs to a
key; keys without a row read `MISSING` (the layer's default row).

Why a row is drawn anew after a key takes it, not when it is freed: the
contents of a free row then never matter, so a checkpoint holds only the rows
in use (and a restore onto other shards needs nothing else), and a fresh pool
need not be drawn at all. It is drawn by its first read (`read_rows`), under
the pool's lock, so that an update of the row's previous key that is under
way finishes first; that update, and any later one computed for the previous
key, leaves the row out (`current_rows`).

Why the hash tables are rebuilt now and then: TF's `DenseHashTable` marks a
removed key's bucket "deleted" and only an insert that probes it first reuses
it, so under steady removals (evictions, admitted candidates) empty buckets
run out, and a lookup of a missing key then probes every bucket and fails
(measured: 64 buckets, at most 21 live keys, fails after 241 inserts). Each
table counts its removals; once they reach a quarter of its buckets it is
cleared and its live keys inserted again (O(buckets), amortised over those
removals), so at least a quarter of the buckets stay empty.

Costs: a training step does O(its keys) work on the shard; an eviction
(shard full) selects its rows in O(capacity) and is amortised by freeing a
chunk (`dynamic_eviction.EVICTION_CHUNK` of the capacity) at once; the age sweep is
O(capacity) every ``max(1, max_age_steps // AGE_SWEEP_EVERY)`` steps.

"Steps" are this table's training calls, counted per shard (one per
training step when the model calls the layer once per step; under
parameter_server, every worker's step counts).
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import CONFIG_CHECK, ConfigError
from tfdist_trainer.sharding import update_lock
from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.eviction import ShardEviction
from tfdist_trainer.sharding.dynamic.keys import DELETED_KEY, EMPTY_KEY, reserved

#: The row of a key that has none: the layer reads its default row instead.
MISSING = -1
#: Admission candidates a shard keeps: max(capacity, MIN_CANDIDATES); past that the least seen go.
MIN_CANDIDATES = 1024
#: Counters a shard reports (`DynamicTableShard.counters`).
COUNTERS = ("rows_in_use", "admitted", "evicted", "expired")


def buckets(capacity: int) -> int:
    """Hash-table buckets for `capacity` keys at a load of at most one half (no rehash while it fills)."""
    return max(16, 1 << (2 * capacity - 1).bit_length())


class DynamicTableShard(ShardEviction, tf.Module):
    """One shard's state and the operations that change it, all on the shard's device.

    Create it inside the strategy's scope and under the variable placement of
    the shard's device (its variables follow the variable creator); the hash
    tables and the critical section are created under ``tf.device(device)``.
    """

    def __init__(
        self,
        *,
        where: str,
        pool: Any,
        reinitializer: Any,
        min_count: int,
        max_age_steps: int | None,
        device: str | None,
        concurrent: bool = True,
        layer_shards: int = 1,
    ):
        super().__init__(name=None)
        capacity, dim = (int(d) for d in pool.shape)
        self.where = where  # "layer shard i", for messages
        self.capacity, self.dim = capacity, dim
        self.min_count, self.max_age_steps = min_count, max_age_steps
        self.candidate_limit = max(capacity, MIN_CANDIDATES)
        self.device = device
        # Whether several training steps may run at once (parameter_server workers): then each
        # step's read-modify-write runs in the critical section.
        self.concurrent = concurrent
        self.layer_shards = layer_shards  # the layer's shard count, for messages
        self.pool = pool
        self.__dict__["_reinitializer"] = reinitializer
        seed = getattr(reinitializer, "seed", None)
        # Saved with the table: a resumed run draws the same rows.
        self.__dict__["_seed_state"] = (
            seed.state if isinstance(seed, keras.random.SeedGenerator) else None
        )
        self.__dict__["_slots"] = []  # (name, optimizer slot, its initial row): not ours to save
        self.__dict__["_traced"] = False
        # graph -> the clock of that graph's first training lookup of the shard (`current_rows`)
        self.__dict__["_lookup_clocks"] = weakref.WeakKeyDictionary()

        def int64(value, name):
            return tf.Variable(value, dtype=tf.int64, trainable=False, name=name)

        with tf.init_scope():
            self.row_key = int64(tf.fill([capacity], tf.constant(EMPTY_KEY, tf.int64)), "row_key")
            self.frequency = int64(tf.zeros([capacity], tf.int64), "frequency")
            self.last_seen = int64(tf.zeros([capacity], tf.int64), "last_seen")
            # The step (clock) at which each row was taken by its key: an update computed from
            # an earlier step's lookup is stale there (`current_rows`). Not checkpointed.
            self.taken_at = int64(tf.zeros([capacity], tf.int64), "taken_at")
            # Rows taken by a key and not read since: drawn anew by their first read.
            self.undrawn = tf.Variable(
                tf.zeros([capacity], tf.bool), trainable=False, name="undrawn"
            )
            # Free rows are free_rows[0:free], free = capacity - rows_in_use, popped from the end.
            self.free_rows = int64(np.arange(capacity - 1, -1, -1, dtype=np.int64), "free_rows")
            self.clock = int64(0, "clock")
            self.rows_in_use = int64(0, "rows_in_use")
            self.admitted = int64(0, "admitted")
            self.evicted = int64(0, "evicted")
            self.expired = int64(0, "expired")
            # Removals from each hash table since it was last rebuilt (not checkpointed: a
            # restore rebuilds the tables).
            self.__dict__["_removals"] = {
                "table": int64(0, "table_removals"),
                "candidates": int64(0, "candidate_removals"),
            }
            with self.on_device():
                self.table = tf.lookup.experimental.DenseHashTable(
                    tf.int64,
                    tf.int64,
                    default_value=MISSING,
                    empty_key=EMPTY_KEY,
                    deleted_key=DELETED_KEY,
                    initial_num_buckets=buckets(capacity),
                    name="rows",
                    experimental_is_anonymous=True,
                )
                self.candidates = None
                if min_count > 1:
                    self.candidates = tf.lookup.experimental.DenseHashTable(
                        tf.int64,
                        tf.int64,
                        default_value=0,
                        empty_key=EMPTY_KEY,
                        deleted_key=DELETED_KEY,
                        initial_num_buckets=buckets(self.candidate_limit),
                        name="candidates",
                        experimental_is_anonymous=True,
                    )
                # A name of its own: CriticalSections created eagerly under one name share one mutex,
                # and a step locking two of them then waits for itself.
                self.__dict__["_critical_section"] = tf.CriticalSection(
                    name="dynamic_table", shared_name=f"tfdist_dynamic_table_{uuid.uuid4().hex}"
                )

    def on_device(self):
        """A context placing ops on the shard's device (nothing under no device)."""
        return tf.device(self.device) if self.device else contextlib.nullcontext()

    # -- state that is not ours -------------------------------------------------
    def state_variables(self) -> list:
        """The bookkeeping variables (not the pool): what the placement ledger counts besides it."""
        return [
            self.row_key,
            self.frequency,
            self.last_seen,
            self.taken_at,
            self.undrawn,
            self.free_rows,
        ]

    @property
    def counters(self) -> dict[str, tf.Variable]:
        return {name: getattr(self, name) for name in COUNTERS}

    @property
    def seed_state(self) -> Any:
        """The re-initialiser's seed state (a variable), or None for an unseeded initializer."""
        return self._seed_state

    @property
    def slots(self) -> list[tuple[str, Any]]:
        """(name, optimizer slot variable) of each registered slot of the pool."""
        return [(name, slot) for name, slot, _ in self._slots]

    def register_slot(self, name: str, slot: Any, initializer: Any) -> None:
        """An optimizer slot of the pool: a row taken by a new key is reset to `initializer`'s value.

        Called by `ReshardableOptimizerMixin.add_variable_from_reference`. The
        reset is part of the traced training step, so the optimizer must be
        built before that step is first traced (Keras' fit and the Trainer do).
        """
        if self._traced:
            raise RuntimeError(
                f"{self.where}: the optimizer was built after the training step was traced, so "
                f"evicted rows would keep its slot values; build the optimizer first "
                f"(optimizer.build(model.trainable_variables))."
            )
        with tf.init_scope():
            row = keras.initializers.get(initializer)(shape=(1, self.dim), dtype=slot.dtype)
            self._slots.append((name, slot, np.asarray(row)))

    # -- inference -----------------------------------------------------------------
    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Rows of int64 `keys` (1-D); unknown and reserved keys read `MISSING`. Inserts nothing."""
        with self.on_device():
            bad = reserved(keys)
            rows = tf.reshape(
                self.table.lookup(tf.where(bad, tf.zeros_like(keys), keys)), tf.shape(keys)
            )
            return tf.where(bad, tf.constant(MISSING, tf.int64), rows)

    # -- training ------------------------------------------------------------------
    def lookup_or_insert(self, keys: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
        """Rows of distinct int64 `keys` (1-D), seen `counts` times in this batch; admits, evicts, ages.

        Runs on the shard's device, inside the shard's critical section when steps may run
        concurrently (`concurrent`); otherwise the function's own ordering of the shard's
        stateful ops suffices and the lock's ops are saved (one_device: 26 tables of 2 shards,
        about 38 -> 40 steps/s on this 2-core machine).
        """
        if not tf.executing_eagerly():
            self.__dict__["_traced"] = True
        with self.on_device():
            if not self.concurrent:  # one step at a time: the function's own ordering suffices
                rows, clock = self._step(keys, counts)
            else:
                # Not exclusive: the pool is read and written under its own lock (`read_rows`,
                # the optimizer's updates).
                rows, clock = self._critical_section.execute(
                    lambda: self._step(keys, counts), exclusive_resource_access=False
                )
        self._note_lookup_clock(clock)
        return rows

    # -- updates of rows whose key changed ---------------------------------------------
    def _note_lookup_clock(self, clock: tf.Tensor) -> None:
        if tf.executing_eagerly():
            return
        graph = tf.compat.v1.get_default_graph()
        first = self._lookup_clocks.get(graph)
        self._lookup_clocks[graph] = clock if first is None else tf.minimum(first, clock)

    def current_rows(self, gradient: tf.IndexedSlices) -> tf.IndexedSlices:
        """`gradient` (of the pool) without the rows taken by another key since this step looked
        its keys up; run it under the pool's lock, where no row is drawn anew meanwhile.

        Why: between a step's lookup and its update, another worker's step (or a later call
        of the layer in the same step) may evict a row the step read and give it to a new
        key; the update would then land on the new key, which would start from the old key's
        gradient. A row taken after the step's first lookup of the shard is dropped from the
        update (the old key has left the table; its last gradient goes with it). A gradient
        made in a graph with no lookup of this shard (a step split over functions) is kept
        whole: there is nothing to compare against.
        """
        clock = self._lookup_clock_of(tf.compat.v1.get_default_graph())
        if clock is None or not isinstance(gradient, tf.IndexedSlices):
            return gradient
        with self.on_device():
            rows = tf.cast(gradient.indices, tf.int64)
            keep = (tf.gather(self.taken_at, rows) <= clock) & (
                tf.gather(self.row_key, rows) != EMPTY_KEY
            )
            return tf.IndexedSlices(
                tf.boolean_mask(gradient.values, keep),
                tf.boolean_mask(gradient.indices, keep),
                gradient.dense_shape,
            )

    def _lookup_clock_of(self, graph: Any) -> tf.Tensor | None:
        while graph is not None:  # an update in a cond or loop body nested in the step's graph
            clock = self._lookup_clocks.get(graph)
            if clock is not None:
                return clock
            graph = getattr(graph, "outer_graph", None)
        return None

    def _step(self, keys: tf.Tensor, counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # First, before this step reads them: rebuild a table worn by the removals of earlier steps.
        upkeep = [self._rebuild_if_worn("table", MISSING)]
        if self.candidates is not None:
            upkeep.append(self._rebuild_if_worn("candidates", 0))
        with tf.control_dependencies(effect_ops(upkeep)):
            return self._steps_work(keys, counts)

    def _steps_work(self, keys: tf.Tensor, counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        effects: list = []
        clock = tf.convert_to_tensor(self.clock.assign_add(1))
        bad = reserved(keys)
        rows = tf.reshape(
            self.table.lookup(tf.where(bad, tf.zeros_like(keys), keys)), tf.shape(keys)
        )
        found = (rows >= 0) & ~bad
        found_rows = tf.boolean_mask(rows, found)
        seen = tf.fill(tf.shape(found_rows), clock)
        effects += [
            self.frequency.scatter_add(
                tf.IndexedSlices(tf.boolean_mask(counts, found), found_rows)
            ),
            self.last_seen.scatter_update(tf.IndexedSlices(seen, found_rows)),
        ]
        missing = ~found & ~bad
        missing_at = tf.where(missing)[:, 0]
        new_keys, new_counts = tf.boolean_mask(keys, missing), tf.boolean_mask(counts, missing)
        admit, admission = self._admission(new_keys, new_counts)
        effects += admission
        admitted_keys = tf.boolean_mask(new_keys, admit)
        n_new = tf.size(admitted_keys, out_type=tf.int64)
        needed = tf.size(found_rows, out_type=tf.int64) + n_new
        check = self._capacity_check(needed)
        effects.append(check)
        with tf.control_dependencies(effect_ops([check])):
            n_new = tf.identity(n_new)
        effects.append(self._make_room(n_new, clock))
        new_rows, taking = self._take(n_new)
        effects += taking
        admitted_counts = tf.boolean_mask(new_counts, admit)
        effects += [
            self.table.insert(admitted_keys, new_rows),
            self.row_key.scatter_update(tf.IndexedSlices(admitted_keys, new_rows)),
            self.taken_at.scatter_update(
                tf.IndexedSlices(tf.fill(tf.shape(new_rows), clock), new_rows)
            ),
            self.frequency.scatter_update(tf.IndexedSlices(admitted_counts, new_rows)),
            self.last_seen.scatter_update(
                tf.IndexedSlices(tf.fill(tf.shape(new_rows), clock), new_rows)
            ),
            self.admitted.assign_add(n_new),
        ]
        effects.append(self._expire(clock))
        out = tf.where(found, rows, tf.constant(MISSING, tf.int64))
        out = tf.tensor_scatter_nd_update(
            out, tf.boolean_mask(missing_at, admit)[:, None], new_rows
        )
        with tf.control_dependencies(effect_ops(effects)):
            return tf.identity(out), tf.identity(clock)

    def _capacity_check(self, needed: tf.Tensor) -> Any:
        """Fails unless the shard's rows hold the `needed` distinct keys of one batch: a sentence
        with the numbers a user needs to act (keys, rows, the capacity that would do)."""
        parts = [
            f"{self.where}: one batch brought ",
            needed,
            f" distinct keys that need a row to this shard, which holds {self.capacity} rows; "
            f"raise capacity to at least ",
            needed * self.layer_shards,
            f" ({self.layer_shards} shard(s) x the keys this shard got)",
        ]
        if tf.executing_eagerly():  # the layer called eagerly: the sentence as it is
            if int(needed) > self.capacity:
                raise ConfigError(
                    "".join(str(p if isinstance(p, str) else int(p)) for p in parts) + "."
                )
            return tf.constant(True)
        # In a traced step: an assertion named CONFIG_CHECK, whose parts config_checks.py joins.
        return tf.debugging.Assert(needed <= self.capacity, parts, name=CONFIG_CHECK)

    def _admission(self, keys: tf.Tensor, counts: tf.Tensor) -> tuple[tf.Tensor, list]:
        """Which new keys get a row now (seen `min_count` times in all), and the candidates' updates."""
        if self.candidates is None:
            return tf.ones_like(keys, tf.bool), []
        total = tf.reshape(self.candidates.lookup(keys), tf.shape(keys)) + counts
        admit = total >= self.min_count
        effects = [
            self.candidates.insert(tf.boolean_mask(keys, ~admit), tf.boolean_mask(total, ~admit)),
            self._remove("candidates", tf.boolean_mask(keys, admit)),
        ]
        with tf.control_dependencies(effect_ops(effects)):
            effects.append(
                tf.cond(
                    self.candidates.size() > self.candidate_limit,
                    self._forget_candidates,
                    lambda: tf.constant(0, tf.int64),
                )
            )
        return admit, effects

    def _forget_candidates(self) -> tf.Tensor:
        """Forgets the candidates seen least often (O(candidates)): the table stays within its limit."""
        keys, counts = (tf.reshape(t, [-1]) for t in self.candidates.export())
        valid = keys > DELETED_KEY
        least = tf.reduce_min(tf.boolean_mask(counts, valid))
        forget = tf.boolean_mask(keys, valid & (counts <= least))
        with tf.control_dependencies(effect_ops([self._remove("candidates", forget)])):
            return tf.size(forget, out_type=tf.int64)

    def _take(self, n: tf.Tensor) -> tuple[tf.Tensor, list]:
        """Pops `n` rows off the free stack (rows 0, 1, ... of a fresh shard first), marked to be
        drawn anew by their first read (`read_rows`); returns the rows and those updates."""
        free = self.capacity - self.rows_in_use.read_value()
        rows = tf.gather(self.free_rows, free - 1 - tf.range(n))
        with tf.control_dependencies([rows]):
            taken = self.rows_in_use.assign_add(n)
        marked = self.undrawn.scatter_update(tf.IndexedSlices(tf.ones_like(rows, tf.bool), rows))
        return rows, [taken, marked]

    # -- the pool ----------------------------------------------------------------------
    def read_rows(self, rows: tf.Tensor) -> tf.Tensor:
        """The pool's distinct `rows`, each row a key took since it was last read drawn anew first
        (its optimizer slots reset); under the pool's own lock where steps run concurrently.

        Why the draw happens here and not when the key takes the row (in the shard's critical
        section): the pool's updates run under the pool's lock (`update_lock`), and a row must
        never be redrawn in the middle of one. Drawing it under that same lock, by whichever
        step reads it first, orders the draw after every update that was already running and
        before every read of the new key. (Giving the lookup and the updates one lock instead
        hung 2 workers within 40 steps on TF 2.21, with LFU evictions under way.)
        """
        lock = update_lock.lock_of(self.pool)

        def draw_then_read():
            with self.on_device():
                drawn = self._draw(tf.boolean_mask(rows, tf.gather(self.undrawn, rows)))
                with tf.control_dependencies(effect_ops(drawn)):
                    return tf_compat.sparse_read(self.pool, rows)

        return draw_then_read() if lock is None else lock.read(draw_then_read)

    def _draw(self, rows: tf.Tensor) -> list:
        """Draws `rows` anew from the initializer and resets their optimizer slots."""
        n = tf.size(rows)
        pool = tf_compat.variable_storage(self.pool)
        fresh = self._reinitializer(shape=(n, self.dim), dtype=pool.dtype)
        effects = [
            pool.scatter_update(tf.IndexedSlices(tf.cast(fresh, pool.dtype), rows)),
            self.undrawn.scatter_update(tf.IndexedSlices(tf.zeros_like(rows, tf.bool), rows)),
        ]
        for _, slot, row in self._slots:
            stored = tf_compat.variable_storage(slot)
            effects.append(stored.scatter_update(tf.IndexedSlices(tf.tile(row, [n, 1]), rows)))
        return effects

    # -- hash-table upkeep -------------------------------------------------------
    def _remove(self, which: str, keys: tf.Tensor) -> tf.Tensor:
        """Erases `keys` from the table `which` ('table' or 'candidates'), counting the removals."""
        erased = getattr(self, which).erase(keys)
        with tf.control_dependencies(effect_ops([erased])):
            return self._removals[which].assign_add(tf.size(keys, out_type=tf.int64))

    def _rebuild_if_worn(self, which: str, empty_value: int) -> tf.Tensor:
        """Rebuilds the table `which` once its removals reach a quarter of its buckets (module doc)."""
        table = getattr(self, which)

        def rebuild():
            exported = table.export()
            keys, values = (tf.reshape(t, [-1]) for t in exported)
            live = keys > DELETED_KEY
            return self._rebuild(
                which,
                empty_value,
                tf.boolean_mask(keys, live),
                tf.boolean_mask(values, live),
                exported_keys=exported[0],
            )

        # The buckets it was made with (TF may have doubled them since: then it is rebuilt early).
        worn = self._removals[which].read_value() * 4 >= self._buckets_of(which)
        return tf.cond(worn, rebuild, lambda: tf.constant(0, tf.int64))

    def _buckets_of(self, which: str) -> int:
        """The buckets the table `which` is made (and rebuilt) with."""
        return buckets(self.capacity if which == "table" else self.candidate_limit)

    def _rebuild(
        self,
        which: str,
        empty_value: int,
        keys: tf.Tensor,
        values: tf.Tensor,
        exported_keys: tf.Tensor | None = None,
    ):
        """Clears the table `which` (TF's import of an all-empty bucket array: no deleted buckets
        left), then inserts `keys` -> `values`; its removal count starts again at 0.
        `exported_keys`: the table's export, when the caller has it (only its shape is read)."""
        table = getattr(self, which)
        if exported_keys is None:
            exported_keys = table.export()[0]
        # TF doubles the buckets itself on insert if more keys come than this load allows.
        size = self._buckets_of(which)
        # Shaped like the table's own export ([buckets, 1] when run, of unknown rank when traced):
        # what the import kernel and its shape function each accept (as in TF's own restore).
        # Filled at run time from that shape, never a folded constant: the table keeps the
        # imported buffers as its buckets and writes into them.
        shape = tf.concat([[size], tf.shape(exported_keys)[1:]], 0)
        cleared = tf.raw_ops.LookupTableImportV2(
            table_handle=table.resource_handle,
            keys=tf.fill(shape, tf.constant(EMPTY_KEY, tf.int64)),
            values=tf.fill(shape, tf.constant(empty_value, tf.int64)),
        )
        with tf.control_dependencies(effect_ops([cleared])):
            inserted = table.insert(keys, values)
        with tf.control_dependencies(effect_ops([inserted])):
            return self._removals[which].assign(0)

    # -- checkpoints (dynamic/state.py reads and writes the contents) -------------
    def exclusively(self, fn):
        """`fn()`'s result, run where no training step of the shard runs at the same time: in the
        shard's critical section on its device (under no device, `fn()` as it is)."""
        if not self.device:
            return fn()
        return self._critical_section.execute(fn, exclusive_resource_access=False)

    def rebuild(self, which: str, empty_value: int, keys: tf.Tensor, values: tf.Tensor):
        """Clears the hash table `which` ('table' or 'candidates') and inserts `keys` -> `values`."""
        return self._rebuild(which, empty_value, keys, values)
