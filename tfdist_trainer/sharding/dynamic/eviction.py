"""Which rows a full shard frees: the eviction policy, an object that owns its metadata and its score.

Why an object: the policy is what users tune and contributors change, and it
needs only three things of the shard: to hear which rows a step saw and took
(to keep its metadata), which rows were freed, and to rank rows by a score
(higher: keep). The shard does the freeing itself (its key leaves the hash
table, the row goes on the free stack, drawn anew when a key takes it); the
same score ranks the keys a checkpoint restored onto smaller shards keeps.
Every policy sees each row's last sighting (``last_seen``, the shard's own:
the age sweep and "never evict a row this step saw" read it too); a policy's
own metadata, one int64 per row and name in `metadata_names`, is made, kept
and checkpointed with each key.

A new policy is one subclass here and one entry in `EVICTION_POLICIES`; the
layer takes its name (``DynamicEmbedding(eviction="lru")``). TorchRec's
managed-collision modules have the same shape (`MCHEvictionPolicy` with its
LFU and LRU policies).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import tensorflow as tf

from tfdist_trainer.errors import ConfigError

#: An eviction frees at least capacity // EVICTION_CHUNK rows (the lowest scores first).
EVICTION_CHUNK = 16
#: The age sweep runs every max(1, max_age_steps // AGE_SWEEP_EVERY) steps.
AGE_SWEEP_EVERY = 8

_INT64_MAX = np.iinfo(np.int64).max


class EvictionPolicy:
    """What a shard's eviction policy is: per-row metadata, kept as rows are seen, taken and
    freed, and a score. Create it where the shard creates its variables (its placement)."""

    #: The name the layer's ``eviction`` argument takes.
    name: ClassVar[str]
    #: The policy's own per-row int64 metadata (saved with each key in checkpoints).
    metadata_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, capacity: int):
        with tf.init_scope():
            self.metadata = {
                name: tf.Variable(tf.zeros([capacity], tf.int64), trainable=False, name=name)
                for name in self.metadata_names
            }

    def seen(self, rows: tf.Tensor, counts: tf.Tensor) -> list:
        """Rows whose keys a step found, each seen `counts` times in its batch: the updates."""
        return []

    def taken(self, rows: tf.Tensor, counts: tf.Tensor) -> list:
        """Rows new keys took in a step, each seen `counts` times in its batch: the updates."""
        return []

    def freed(self, rows: tf.Tensor) -> list:
        """Rows whose keys left (evicted, expired): their metadata back to zero."""
        zeros = tf.zeros_like(rows)
        return [m.scatter_update(tf.IndexedSlices(zeros, rows)) for m in self.metadata.values()]

    def score(self, last_seen: tf.Tensor, metadata: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """One int64 per row, higher for rows to keep; `metadata` holds `metadata_names` (the
        variables, or a checkpoint's saved values of the same rows)."""
        raise NotImplementedError

    def victims(self, k: tf.Tensor, eligible: tf.Tensor, last_seen: tf.Tensor) -> tf.Tensor:
        """The `k` eligible rows of the lowest score (int64 row numbers)."""
        score = tf.where(
            eligible, self.score(last_seen, self.metadata), tf.constant(_INT64_MAX, tf.int64)
        )
        _, rows = tf.math.top_k(-score, k=tf.cast(k, tf.int32))
        return tf.cast(rows, tf.int64)


class LFUEviction(EvictionPolicy):
    """Least frequently used first (sightings since the key took its row); equally frequent:
    least recently seen first. Keeps a steady head of popular keys through bursts of new ones."""

    name = "lfu"
    metadata_names = ("frequency",)

    def seen(self, rows, counts):
        return [self.metadata["frequency"].scatter_add(tf.IndexedSlices(counts, rows))]

    def taken(self, rows, counts):
        return [self.metadata["frequency"].scatter_update(tf.IndexedSlices(counts, rows))]

    def score(self, last_seen, metadata):
        frequency = tf.convert_to_tensor(metadata["frequency"])
        last_seen = tf.convert_to_tensor(last_seen)
        return tf.minimum(frequency, 2**31 - 1) * (2**32) + tf.minimum(last_seen, 2**32 - 1)


class LRUEviction(EvictionPolicy):
    """Least recently seen first: no metadata of its own. Follows drifting popularity (today's
    items) faster than LFU, whose old counts keep yesterday's keys."""

    name = "lru"

    def score(self, last_seen, metadata):
        return tf.convert_to_tensor(last_seen)


#: The policies by the name the layer's ``eviction`` argument takes.
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    policy.name: policy for policy in (LFUEviction, LRUEviction)
}


def eviction_policy(layer_name: str, name: str) -> type[EvictionPolicy]:
    """The policy class named `name`; an unknown name is a ConfigError of one sentence."""
    if name not in EVICTION_POLICIES:
        raise ConfigError(
            f"{layer_name}: eviction must be one of {', '.join(map(repr, EVICTION_POLICIES))}, "
            f"got {name!r}."
        )
    return EVICTION_POLICIES[name]
