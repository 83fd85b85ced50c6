"""Keys of a dynamic table: checked, turned into int64 (strings by fingerprint) and hashed to a shard.

Why a fingerprint and not a bucket hash: a dynamic table gives every key its
own row, so a string needs a 64-bit identity (`tf.fingerprint`, FarmHash,
stable across platforms and TF versions), not one of N buckets. Why a hash
for the shard and not ``key mod N``: structured ids (a type tag in the low
bits, ids that step by N) put every key of a kind on one shard.

The two smallest int64 values mark empty and deleted buckets of the
shards' hash tables (`EMPTY_KEY`, `DELETED_KEY`): such a key is never given
a row and reads the default row.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.errors import ConfigError

KEY_DTYPES = ("int64", "string")
EMPTY_KEY = -(2**63)
DELETED_KEY = -(2**63) + 1


def _fingerprint64(values: tf.Tensor) -> tf.Tensor:
    """FarmHash fingerprint of each element of a 1-D tensor (each row of a 2-D one), as uint64
    (its first 8 bytes)."""
    return tf.bitcast(tf.fingerprint(values), tf.uint64)


def as_int64_keys(layer_name: str, key_dtype: str, keys: Any) -> tf.Tensor:
    """`keys` (any shape) as int64 keys; a wrong kind of tensor is a ConfigError of one sentence."""
    if isinstance(keys, (tf.RaggedTensor, tf.SparseTensor)):
        raise ConfigError(
            f"{layer_name}: keys must be a dense tensor, got a {type(keys).__name__}; "
            f"pad it (e.g. ragged.to_tensor(default_value=...)) or pass its flat values."
        )
    keys = tf.convert_to_tensor(keys)
    if key_dtype == "string":
        if keys.dtype != tf.string:
            raise ConfigError(
                f"{layer_name}: key_dtype='string' but the keys are {keys.dtype.name}; "
                f"pass strings, or use key_dtype='int64' for integer ids."
            )
        flat = tf.reshape(keys, [-1])
        ints = tf.bitcast(_fingerprint64(flat), tf.int64)
        return tf.reshape(ints, tf.shape(keys))
    if not keys.dtype.is_integer:
        raise ConfigError(
            f"{layer_name}: key_dtype='int64' needs integer ids, got {keys.dtype.name} keys; "
            f"cast exact integer ids to int64, or use key_dtype='string' for strings."
        )
    return tf.cast(keys, tf.int64)


def stacked_keys(layer_name: str, keys: tf.Tensor, features: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Keys of `features` features stacked on the last axis as one key space: (feature, key) -> int64.

    Returns the stacked keys (the shape of `keys`) and each one's feature (int64). A stacked
    key is the 64-bit fingerprint of the pair, so key k of feature f and key k of feature g are
    different keys; two pairs share one only by a 64-bit collision (about n^2 / 2^65 for n keys:
    1e-6 for 6 M keys, as for string keys).
    """
    if keys.shape.rank is None or keys.shape.rank < 1 or keys.shape[-1] != features:
        raise ConfigError(
            f"{layer_name}: stacked_features={features} needs keys whose last axis holds one key "
            f"of each of the {features} features, got keys of shape {keys.shape}."
        )
    feature = tf.broadcast_to(tf.range(features, dtype=tf.int64), tf.shape(keys))
    pairs = tf.stack([tf.reshape(feature, [-1]), tf.reshape(keys, [-1])], axis=1)
    stacked = tf.bitcast(_fingerprint64(pairs), tf.int64)
    return tf.reshape(stacked, tf.shape(keys)), feature


def shard_of(keys: tf.Tensor, num_shards: int) -> tf.Tensor:
    """The shard (int32) of each int64 key of a 1-D tensor: a stable 64-bit hash of the key, mod N."""
    if num_shards == 1:
        return tf.zeros_like(keys, tf.int32)
    hashed = _fingerprint64(keys)
    return tf.cast(tf.math.floormod(hashed, tf.constant(num_shards, tf.uint64)), tf.int32)


def reserved(keys: tf.Tensor) -> tf.Tensor:
    """Whether each key is one of the two values the hash tables reserve (never given a row)."""
    return tf.less_equal(keys, DELETED_KEY)
