"""Admission by `min_count`: a new key gets a row once it was seen that many times in all.

Why a table of candidates: a key seen once (most of a long tail) would otherwise take a
row and push out a useful one. Candidates are counted in a hash table of their own
(key -> times seen), bounded: past its limit the least seen are forgotten, so a tail of
one-off keys costs at most `limit` entries.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.sharding.dynamic.effects import effect_ops
from tfdist_trainer.sharding.dynamic.hash_table import KeyTable

#: Admission candidates a shard keeps: max(capacity, MIN_CANDIDATES); past that the least seen go.
MIN_CANDIDATES = 1024


class Admission:
    """Which new keys of a shard get a row now; `candidates` is None when `min_count` is 1."""

    def __init__(self, *, min_count: int, capacity: int, device):
        self.min_count = min_count
        self.limit = max(capacity, MIN_CANDIDATES)
        self.candidates = None
        if min_count > 1:
            self.candidates = KeyTable(
                name="candidates", capacity=self.limit, default_value=0, device=device
            )

    def upkeep(self) -> list:
        """Before a step reads the candidates: their table rebuilt if removals wore it."""
        return [] if self.candidates is None else [self.candidates.rebuild_if_worn()]

    def admit(self, keys: tf.Tensor, counts: tf.Tensor) -> tuple[tf.Tensor, list]:
        """Which of the new `keys` (seen `counts` times in this batch) get a row, and the updates
        of the candidates (the others counted; the admitted and, past the limit, the least seen
        forgotten)."""
        if self.candidates is None:
            return tf.ones_like(keys, tf.bool), []
        total = self.candidates.lookup(keys) + counts
        admit = total >= self.min_count
        effects = [
            self.candidates.insert(tf.boolean_mask(keys, ~admit), tf.boolean_mask(total, ~admit)),
            self.candidates.remove(tf.boolean_mask(keys, admit)),
        ]
        with tf.control_dependencies(effect_ops(effects)):
            effects.append(
                tf.cond(
                    self.candidates.size() > self.limit,
                    self._forget_least_seen,
                    lambda: tf.constant(0, tf.int64),
                )
            )
        return admit, effects

    def _forget_least_seen(self) -> tf.Tensor:
        """Forgets the candidates seen least often (O(candidates)): the table stays within its limit."""
        keys, counts, _ = self.candidates.live()
        least = tf.reduce_min(counts)
        forget = tf.boolean_mask(keys, counts <= least)
        with tf.control_dependencies(effect_ops([self.candidates.remove(forget)])):
            return tf.size(forget, out_type=tf.int64)

    def export(self) -> dict[str, tf.Tensor]:
        """The candidates as a checkpoint holds them (nothing when `min_count` is 1)."""
        if self.candidates is None:
            return {}
        keys, counts, _ = self.candidates.live()
        return {"candidate_keys": keys, "candidate_counts": counts}

    def restore(self, state: dict[str, tf.Tensor]) -> list:
        """The candidates of `state` (as `export` gives them), the most seen up to the limit."""
        if self.candidates is None or "candidate_keys" not in state:
            return []
        keys, counts = state["candidate_keys"], state["candidate_counts"]
        keep = tf.minimum(tf.size(keys), self.limit)
        counts, order = tf.math.top_k(counts, k=keep)
        return [self.candidates.replace(tf.gather(keys, order), counts)]
