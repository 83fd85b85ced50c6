"""One shard of a dynamic table: a key -> row hash table, a row pool and its bookkeeping, on one device.

Why a critical section: under parameter_server several workers run the
training step at once, and "look up, give the missing keys rows, look up
again" is a read-modify-write of the shard's state. Every such step of one
shard runs inside the shard's `tf.CriticalSection`, placed with the state on
the shard's ps task, so two workers meeting the same new key in the same step
end with exactly one row for it. Lookups for inference read the hash table
only (its own mutex makes a single lookup safe) and never insert.

The state is plain: a key -> row hash table (hash_table.py: it keeps empty
buckets under steady removals), the admission candidates (admission.py), and
int64 variables of ``capacity`` entries (the row's key, the step it was last
seen, a stack of free rows, the eviction policy's metadata: eviction.py) plus
scalar counters. Every row belongs to a key; keys without a row read
`MISSING` (the layer's default row).

Why a row is drawn anew after a key takes it, not when it is freed: the
contents of a free row then never matter, so a checkpoint holds only the rows
in use (and a restore onto other shards needs nothing else), and a fresh pool
need not be drawn at all. It is drawn by its first read (`read_rows`), under
the pool's lock, so that an update of the row's previous key that is under
way finishes first; that update, and any later one computed for the previous
key, leaves the row out (`current_rows`).

Costs: a training step does O(its keys) work on the shard; an eviction
(shard full) selects its rows in O(capacity) and is amortised by freeing a
chunk (`eviction.EVICTION_CHUNK` of the capacity) at once; the age sweep is
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
from tfdist_trainer.sharding.dynamic.admission import Admission
from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.eviction import (
    AGE_SWEEP_EVERY,
    EVICTION_CHUNK,
    EvictionPolicy,
    LFUEviction,
)
from tfdist_trainer.sharding.dynamic.hash_table import KeyTable
from tfdist_trainer.sharding.dynamic.keys import EMPTY_KEY, reserved

#: The row of a key that has none: the layer reads its default row instead.
MISSING = -1
#: Counters a shard reports (`DynamicTableShard.counters`).
COUNTERS = ("rows_in_use", "admitted", "evicted", "expired")


def _seed_state(initializer: Any) -> Any:
    """The state variable of `initializer`'s seed generator, or None for an unseeded one."""
    seed = getattr(initializer, "seed", None)
    return seed.state if isinstance(seed, keras.random.SeedGenerator) else None


class DynamicTableShard(tf.Module):
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
        eviction: type[EvictionPolicy] = LFUEviction,
    ):
        super().__init__(name=None)
        capacity, dim = (int(d) for d in pool.shape)
        self.where = where  # "layer shard i", for messages
        self.capacity, self.dim = capacity, dim
        self.min_count, self.max_age_steps = min_count, max_age_steps
        self.device = device
        # Whether several training steps may run at once (parameter_server workers): then each
        # step's read-modify-write runs in the critical section.
        self.concurrent = concurrent
        self.layer_shards = layer_shards  # the layer's shard count, for messages
        self.pool = pool
        self.__dict__["_reinitializer"] = reinitializer
        # Saved with the table: a resumed run draws the same rows.
        self.__dict__["_seed_state"] = _seed_state(reinitializer)
        self.__dict__["_slots"] = []  # (name, optimizer slot, its initial row): not ours to save
        self.__dict__["_traced"] = False
        # graph -> the clock of that graph's first training lookup of the shard (`current_rows`)
        self.__dict__["_lookup_clocks"] = weakref.WeakKeyDictionary()

        with tf.init_scope():
            self._make_bookkeeping(capacity)
            # Which rows a full shard frees, with its per-row metadata.
            self.eviction = eviction(capacity)
            # Plain objects (not tracked): the layer saves the table by key.
            self.key_rows = KeyTable(
                name="rows", capacity=capacity, default_value=MISSING, device=self.on_device
            )
            self.admission = Admission(
                min_count=min_count, capacity=capacity, device=self.on_device
            )
            with self.on_device():
                # A name of its own: CriticalSections created eagerly under one name share one mutex,
                # and a step locking two of them then waits for itself.
                self.__dict__["_critical_section"] = tf.CriticalSection(
                    name="dynamic_table", shared_name=f"tfdist_dynamic_table_{uuid.uuid4().hex}"
                )

    def _make_bookkeeping(self, capacity: int) -> None:
        """The shard's int64 bookkeeping of `capacity` rows and its counters (under the variable
        placement of the shard's device, like the pool)."""

        def int64(value, name):
            return tf.Variable(value, dtype=tf.int64, trainable=False, name=name)

        self.row_key = int64(tf.fill([capacity], tf.constant(EMPTY_KEY, tf.int64)), "row_key")
        self.last_seen = int64(tf.zeros([capacity], tf.int64), "last_seen")
        # The step (clock) at which each row was taken by its key: an update computed from
        # an earlier step's lookup is stale there (`current_rows`). Not checkpointed.
        self.taken_at = int64(tf.zeros([capacity], tf.int64), "taken_at")
        # Rows taken by a key and not read since: drawn anew by their first read.
        self.undrawn = tf.Variable(tf.zeros([capacity], tf.bool), trainable=False, name="undrawn")
        # Free rows are free_rows[0:free], free = capacity - rows_in_use, popped from the end.
        self.free_rows = int64(np.arange(capacity - 1, -1, -1, dtype=np.int64), "free_rows")
        self.clock = int64(0, "clock")
        for name in COUNTERS:
            setattr(self, name, int64(0, name))

    def on_device(self):
        """A context placing ops on the shard's device (nothing under no device)."""
        return tf.device(self.device) if self.device else contextlib.nullcontext()

    # -- state that is not ours -------------------------------------------------
    def state_variables(self) -> list:
        """The bookkeeping variables (not the pool): what the placement ledger counts besides it."""
        return [
            self.row_key,
            self.last_seen,
            self.taken_at,
            self.undrawn,
            self.free_rows,
            *self.eviction.metadata.values(),
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
            rows = self.key_rows.lookup(tf.where(bad, tf.zeros_like(keys), keys))
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
        upkeep = [self.key_rows.rebuild_if_worn(), *self.admission.upkeep()]
        with tf.control_dependencies(effect_ops(upkeep)):
            return self._steps_work(keys, counts)

    def _steps_work(self, keys: tf.Tensor, counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        effects: list = []
        clock = tf.convert_to_tensor(self.clock.assign_add(1))
        bad = reserved(keys)
        rows = self.key_rows.lookup(tf.where(bad, tf.zeros_like(keys), keys))
        found = (rows >= 0) & ~bad
        found_rows = tf.boolean_mask(rows, found)
        seen = tf.fill(tf.shape(found_rows), clock)
        effects += [
            *self.eviction.seen(found_rows, tf.boolean_mask(counts, found)),
            self.last_seen.scatter_update(tf.IndexedSlices(seen, found_rows)),
        ]
        missing = ~found & ~bad
        missing_at = tf.where(missing)[:, 0]
        new_keys, new_counts = tf.boolean_mask(keys, missing), tf.boolean_mask(counts, missing)
        admit, admission = self.admission.admit(new_keys, new_counts)
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
            self.key_rows.insert(admitted_keys, new_rows),
            self.row_key.scatter_update(tf.IndexedSlices(admitted_keys, new_rows)),
            self.taken_at.scatter_update(
                tf.IndexedSlices(tf.fill(tf.shape(new_rows), clock), new_rows)
            ),
            *self.eviction.taken(new_rows, admitted_counts),
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

    # -- freeing rows ----------------------------------------------------------------
    def _make_room(self, n_new: tf.Tensor, clock: tf.Tensor) -> tf.Tensor:
        """Evicts when `n_new` rows do not fit: frees at least a chunk of the rows the policy
        scores lowest, never one this step has seen."""
        chunk = max(1, self.capacity // EVICTION_CHUNK)
        shortfall = n_new - (self.capacity - self.rows_in_use.read_value())

        def evict():
            eligible = (self.row_key.read_value() != EMPTY_KEY) & (self.last_seen < clock)
            k = tf.minimum(
                tf.maximum(tf.constant(chunk, tf.int64), shortfall),
                tf.math.count_nonzero(eligible, dtype=tf.int64),
            )
            return self._free(self.eviction.victims(k, eligible, self.last_seen), self.evicted)

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
        free = self.capacity - self.rows_in_use.read_value()
        effects = [
            self.key_rows.remove(keys),
            self.row_key.scatter_update(tf.IndexedSlices(tf.fill([k], EMPTY_KEY), rows)),
            self.last_seen.scatter_update(tf.IndexedSlices(tf.zeros_like(rows), rows)),
            self.free_rows.scatter_update(tf.IndexedSlices(rows, free + tf.range(k))),
            *self.eviction.freed(rows),
        ]
        with tf.control_dependencies(effect_ops(effects)):
            effects = [self.rows_in_use.assign_sub(k), counter.assign_add(k)]
        with tf.control_dependencies(effect_ops(effects)):
            return tf.identity(k)

    # -- checkpoints (state.py reads and writes the contents) -------------------------
    def exclusively(self, fn):
        """`fn()`'s result, run where no training step of the shard runs at the same time: in the
        shard's critical section on its device (under no device, `fn()` as it is)."""
        if not self.device:
            return fn()
        return self._critical_section.execute(fn, exclusive_resource_access=False)
