"""A dynamic table in a checkpoint: its keys and their rows, not its shards, so it restores onto any shards.

Why not each shard's variables, as a tf.Module would save them: a shard's
rows are only meaningful with the shard count that hashed keys to it, so a
checkpoint of 2 ps could not restore onto 3 ps or onto one device (an
export, an evaluator). Saved instead, per table: every key in use with its
values, optimizer slots, last sighting and eviction metadata (the rows in use only,
in shard order), each shard's row numbers, free stack and counters, the
admission candidates and the re-initialisers' seeds.

Restored onto the same shards of the same size, every key gets its old row
back, so a resumed run continues exactly. Onto other shards, every key is
hashed to its new shard and the rows are numbered anew; a shard that cannot
hold its keys keeps those its eviction policy scores highest (the others count as evicted);
the counters' totals move to shard 0 and every clock to the largest.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding.dynamic.keys import shard_of
from tfdist_trainer.sharding.dynamic.shard import DynamicTableShard
from tfdist_trainer.sharding.dynamic.state import export_shard_state, import_shard_state

#: Saved with one element per key in use (``slot_<name>`` and the eviction policy's metadata
#: too); gathered per shard on restore.
_ENTRIES = ("keys", "values", "last_seen")
#: Saved with one element per shard.
_COUNTERS = ("clock", "admitted", "evicted", "expired")


class DynamicTableCheckpoint(tf_compat.trackable_base()):
    """The checkpoint child of a `DynamicEmbedding`: its shards' contents as one set of tensors.

    The same object on every save (the layer caches it): checkpoints compare
    identities.
    """

    def __init__(self, shards_fn):
        self._shards_fn = shards_fn

    @property
    def _shards(self) -> list[DynamicTableShard]:
        return self._shards_fn()

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        shards = self._shards
        states = [export_shard_state(shard) for shard in shards]
        with shards[0].on_device():  # gathered where the first shard lives, not on the saving task
            saved = {
                name: tf.concat([s[name] for s in states], 0)
                for name in states[0]
                if name != "free"
            }
            saved["free"] = tf.concat([s["free"] for s in states], 0)
            saved["entries_per_shard"] = tf.stack([tf.size(s["keys"], tf.int64) for s in states])
            saved["free_per_shard"] = tf.stack([tf.size(s["free"], tf.int64) for s in states])
            saved["shard_capacity"] = tf.constant(shards[0].capacity, tf.int64)
            seeds = [s.seed_state for s in shards]
            if all(seed is not None for seed in seeds):
                saved["seeds"] = tf.stack([tf.convert_to_tensor(seed) for seed in seeds])
        return saved

    def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> Any:
        shards = self._shards
        saved = dict(restored_tensors)
        entries = saved["entries_per_shard"]
        same = tf.logical_and(
            tf.equal(tf.size(entries), len(shards)),
            tf.equal(saved["shard_capacity"], shards[0].capacity),
        )
        # per shard: (indices into the saved entries, their rows, the free stack, keys dropped)
        layout = tf.cond(
            same,
            lambda: _as_saved(len(shards), saved),
            lambda: _rehashed(shards, saved),
        )
        counters = tf.cond(
            same,
            lambda: {name: saved[name] for name in _COUNTERS},
            lambda: _rehashed_counters(len(shards), saved, [d for *_, d in layout]),
        )
        per_key = (*_ENTRIES, *shards[0].eviction.metadata_names)
        names = [n for n in saved if n in per_key or n.startswith("slot_")]
        ops = []
        for i, (shard, (index, rows, free, _)) in enumerate(zip(shards, layout)):
            with shard.on_device():
                state = {name: tf.gather(saved[name], index) for name in names}
                state.update(rows=rows, free=free, **{k: v[i] for k, v in counters.items()})
                if "candidate_keys" in saved:
                    mine = tf.equal(shard_of(saved["candidate_keys"], len(shards)), i)
                    state["candidate_keys"] = tf.boolean_mask(saved["candidate_keys"], mine)
                    state["candidate_counts"] = tf.boolean_mask(saved["candidate_counts"], mine)
                ops += import_shard_state(shard, state)
                if "seeds" in saved and shard.seed_state is not None:
                    seed = tf_compat.variable_storage(shard.seed_state)
                    ops.append(_assign_if(same, seed, lambda i=i: saved["seeds"][i]))
        if tf.executing_eagerly() and not bool(same):
            _say_rehashed(shards, saved, [int(d) for *_, d in layout])
        return None if tf.executing_eagerly() else tf.group(ops)


#: A `.keras` file's entries of a DynamicEmbedding: its Keras weights by position ("0", "1", as
#: Keras' own layers store them), then its table by key under this prefix.
_TABLE_ENTRY = "table:"


def save_to_keras_store(layer: Any, store: Any) -> None:
    """A `.keras` file's weights of a `DynamicEmbedding`: its Keras weights (the default rows), and
    the same tensors as its checkpoint (the table by key), so the file loads onto any shard count.
    String keys are stored as bytes (HDF5 holds no Python objects)."""
    for i, variable in enumerate(layer.weights):
        store[str(i)] = variable.numpy()
    for name, tensor in layer.table_checkpoint._serialize_to_tensors().items():  # noqa: SLF001
        value = tensor.numpy()
        store[_TABLE_ENTRY + name] = value.astype(bytes) if value.dtype == object else value


def load_from_keras_store(layer: Any, store: Any) -> None:
    """The inverse of `save_to_keras_store`: the table restored as from a checkpoint."""
    names = store.keys()  # an HDF5 group's entry: keys() and [name], no iteration
    for i, variable in enumerate(layer.weights):
        variable.assign(store[str(i)][...])
    saved = {
        name[len(_TABLE_ENTRY) :]: tf.constant(store[name][...])
        for name in names
        if name.startswith(_TABLE_ENTRY)
    }
    layer.table_checkpoint._restore_from_tensors(saved)  # noqa: SLF001


def _say_rehashed(shards: list, saved: dict[str, tf.Tensor], dropped: list[int]) -> None:
    """One line for a table restored onto other shards: how many keys moved, and how many a
    shard too small for them dropped (counted as evicted)."""
    table = shards[0].where.rsplit(" shard ", 1)[0]
    saved_shards = int(tf.size(saved["entries_per_shard"]))
    message = (
        f"{table}: {int(tf.size(saved['keys'])):,} keys saved on {saved_shards} shard(s) re-hashed "
        f"onto {len(shards)}"
    )
    if sum(dropped):
        message += (
            f"; {sum(dropped):,} of them dropped (their shards hold {shards[0].capacity:,} rows "
            f"each; counted as evicted: raise capacity to keep them)"
        )
    logging.info("%s", message)


def _assign_if(condition: tf.Tensor, variable: Any, value_fn) -> tf.Tensor:
    """Assigns `value_fn()` to `variable` when `condition` holds (a seed is only a shard's own)."""
    return tf.cond(
        condition,
        lambda: variable.assign(tf.cast(value_fn(), variable.dtype)).read_value(),
        lambda: variable.read_value(),
    )


def _as_saved(n: int, saved: dict[str, tf.Tensor]) -> list:
    """Each shard gets back its own entries at their rows, and its free stack."""
    entries, frees = saved["entries_per_shard"], saved["free_per_shard"]
    entry_starts = tf.cumsum(entries, exclusive=True)
    free_starts = tf.cumsum(frees, exclusive=True)
    out = []
    for i in range(n):
        index = tf.range(entry_starts[i], entry_starts[i] + entries[i])
        stack = saved["free"][free_starts[i] : free_starts[i] + frees[i]]
        out.append((index, tf.gather(saved["rows"], index), stack, tf.constant(0, tf.int64)))
    return out


def _rehashed(shards: list, saved: dict[str, tf.Tensor]) -> list:
    """Each key goes to its shard among these; rows are numbered anew, the least used dropped."""
    shard = shard_of(saved["keys"], len(shards))
    score = shards[0].eviction.score(saved["last_seen"], saved)
    out = []
    for i, target in enumerate(shards):
        index = tf.where(tf.equal(shard, i))[:, 0]
        count = tf.size(index)
        keep = tf.minimum(count, target.capacity)
        _, best = tf.math.top_k(tf.gather(score, index), k=keep)
        index = tf.sort(tf.gather(index, best))  # the saved order among the kept
        keep = tf.cast(keep, tf.int64)
        stack = tf.range(target.capacity - 1, keep - 1, -1, dtype=tf.int64)
        out.append((index, tf.range(keep, dtype=tf.int64), stack, tf.cast(count, tf.int64) - keep))
    return out


def _rehashed_counters(n: int, saved: dict, dropped: list) -> dict[str, tf.Tensor]:
    """Counters after a re-hash: the totals on shard 0 (plus each shard's dropped keys as evicted),
    every clock the latest."""
    first = tf.one_hot(0, n, dtype=tf.int64)
    out = {name: first * tf.reduce_sum(saved[name]) for name in ("admitted", "expired")}
    out["evicted"] = first * tf.reduce_sum(saved["evicted"]) + tf.stack(dropped)
    out["clock"] = tf.fill([n], tf.reduce_max(saved["clock"]))
    return out
