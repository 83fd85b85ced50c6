"""Click data for the sharded-embedding recipe: a synthetic generator with a real signal, and Criteo TSV.

Both yield batches of ``({"dense": float32 [B, num_dense], "categorical": int64
[B, F]}, label float32 [B, 1])``; with ``key_dtype='string'`` the categoricals are
strings [B, F] (raw keys for tables that take strings).

Synthetic clicks: every (feature, id) has a hidden weight, and so does every
dense feature; a click is drawn from a logistic model over their sum. The
weights are a hash of (seed, feature, id) computed with TF integer ops, so
nothing big is captured in the graph, every example is a pure function of
(seed, batch index), and any number of workers can generate disjoint batches.
Ids are Zipf-like (a few ids are frequent, as in real logs) and scattered over
the whole vocabulary, so popular rows do not all fall into one shard. A model
that learns the per-id weights reaches the AUC of the true logits
(`oracle_logits`); a model that learns nothing gets 0.5.

The open id space (``id_space='open'``) is what tables that grow are for: raw
64-bit ids, no vocabulary. A share ``1 - tail_fraction`` of the draws comes from
a fixed Zipf-like head (``vocab_sizes[f]`` ranks per feature, drawn as in the
fixed space); the rest is a long tail of new ids: every batch ``b`` gives birth to
``new_ids_per_batch`` ids, and a tail draw of batch ``b`` picks one of the ids
born in the ``tail_lifetime`` batches up to ``b``. The tail's rank space thus
grows with the batch index; by default as many ids are born as tail draws are
made, so a tail id is seen about once (Poisson(1)), then never again. Each id is
a 64-bit mix (splitmix64) of (feature, rank) scattered over the whole int64 range
(never the two smallest values, which hash tables reserve), and its hidden weight
is defined for any int64 value, so the head is learnable and the tail is noise.
With ``key_dtype='string'`` each id is written as 16 lowercase hex digits
(`hex_ids`; `ids_from_hex` reads them back).

Criteo (Display Advertising Challenge / Criteo 1TB day files): tab-separated
label, 13 integer features, 26 categorical features (8 hex digits or empty).
Integers become log(1 + max(x, 0)); categoricals are hashed into each
feature's vocabulary (`tf.strings.to_hash_bucket_fast`), or, with
``key_dtype='string'``, kept as they are (the raw hex strings, empty for missing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

_M = 2147483647  # 2^31 - 1: products of two values below it fit in int64
_A = 48271
ID_SPACES = ("fixed", "open")
KEY_DTYPES = ("int64", "string")


def _mix(x: tf.Tensor) -> tf.Tensor:
    """A few rounds of Park-Miller plus xor-shift on int64 values in [1, 2^31 - 1)."""
    for shift in (13, 7, 17):
        x = (x * _A) % _M
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift)) % _M
        x = tf.maximum(x, 1)
    return (x * _A) % _M


def hash_uniform(seed: int, stream: int, values: tf.Tensor) -> tf.Tensor:
    """A deterministic uniform in (0, 1) for each int64 value (any, negative included), per
    (seed, stream).

    A value is v = hi * (2^31 - 1) + lo with 0 <= lo < 2^31 - 1 (`%` is a floor modulo); both
    parts are mixed in, hi only when it is not 0, so values in [0, 2^31 - 1) map as they always did.
    """
    values = tf.cast(values, tf.int64)
    lo, hi = values % _M, tf.math.floordiv(values, _M) % _M
    x = (lo * 40503 + hi * 69621 % _M + (stream * 7919 + seed * 104729 + 1) % _M) % _M + 1
    return (tf.cast(_mix(x), tf.float64) + 0.5) / _M


def hidden_weight(seed: int, feature: int, ids: tf.Tensor, scale: float) -> tf.Tensor:
    """The hidden weight of each id of categorical feature `feature`: N(0, scale^2), fixed by the seed."""
    return tf.cast(scale * tf.math.ndtri(hash_uniform(seed, 1000 + feature, ids)), tf.float32)


def _splitmix64(x: tf.Tensor) -> tf.Tensor:
    """splitmix64's finalizer on uint64 values (a bijection; wraps modulo 2^64)."""
    x = x + tf.constant(0x9E3779B97F4A7C15, tf.uint64)
    for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint64)))
        x = x * tf.constant(multiplier, tf.uint64)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(31, tf.uint64)))


def mix_id(feature: int, part: int, ranks: tf.Tensor) -> tf.Tensor:
    """A raw 64-bit id (int64, any value but the two smallest) for each int64 rank of
    (feature, part): distinct ranks give distinct ids, scattered over the whole int64 range."""
    tag = _splitmix64(tf.constant((feature << 8) | part, tf.uint64))
    x = _splitmix64(tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(ranks, tf.int64), tf.uint64), tag))
    ids = tf.bitcast(x, tf.int64)
    # -2^63 and -2^63 + 1 mark empty and deleted buckets of hash tables: never an id.
    return tf.where(ids <= -(2**63) + 1, ids + 2, ids)


def hex_ids(ids: tf.Tensor) -> tf.Tensor:
    """Each int64 id as 16 lowercase hex digits (its 64 bits, two's complement), any shape."""
    # a little-endian host's bytes, lowest first; each byte's two digits from a table of 256
    data = tf.bitcast(tf.cast(ids, tf.int64)[..., None], tf.uint8)[..., 0, :]
    digits = tf.gather(tf.constant([f"{b:02x}" for b in range(256)]), tf.cast(data, tf.int32))
    return tf.strings.join([digits[..., i] for i in range(7, -1, -1)])


def ids_from_hex(strings: tf.Tensor) -> tf.Tensor:
    """`hex_ids` read back: int64 ids from 16-hex-digit strings, any shape."""
    chars = tf.cast(tf.io.decode_raw(strings, tf.uint8, fixed_length=16), tf.int64)
    nibbles = tf.where(chars >= ord("a"), chars - (ord("a") - 10), chars - ord("0"))
    shifts = tf.constant([4 * (15 - i) for i in range(16)], tf.int64)
    return tf.reduce_sum(
        tf.bitwise.left_shift(nibbles, shifts), -1
    )  # disjoint bits: a sum is an or


def _coprime_step(vocab: int) -> int:
    step = 2654435761 % vocab or 1
    while math.gcd(step, vocab) != 1:
        step += 1
    return step


class SyntheticClicks:
    """Generates click batches from a hidden logistic model (see the module docstring).

    Args:
      vocab_sizes: ids per categorical feature (with id_space='open': its head's ranks).
      num_dense: dense features (standard normal).
      seed: fixes the hidden weights; the examples are fixed by (seed, batch index).
      id_weight_scale: standard deviation of the hidden per-id weights.
      dense_weight_scale: standard deviation of the hidden dense weights.
      bias: the logit's offset (-2.0 gives about 30% clicks).
      id_skew: ids are vocab * u**id_skew for uniform u (1: uniform ids; larger: more skewed).
      id_space: 'fixed' (ids below vocab_sizes) or 'open' (raw 64-bit ids: a Zipf-like head, a
        long tail of new ids).
      key_dtype: 'int64', or 'string' (each id as 16 hex digits).
      tail_fraction: with id_space='open', the share of draws from the tail of new ids.
      tail_lifetime: with id_space='open', the batches in which a tail id can be drawn after
        its birth.
      new_ids_per_batch: with id_space='open', tail ids born per batch and feature; None: as many
        as the batch's tail draws (round(batch_size * tail_fraction)), so that a tail id is seen
        about once.
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        *,
        num_dense: int = 13,
        seed: int = 0,
        id_weight_scale: float = 0.6,
        dense_weight_scale: float = 0.3,
        bias: float = -2.0,
        id_skew: float = 3.0,
        id_space: str = "fixed",
        key_dtype: str = "int64",
        tail_fraction: float = 0.25,
        tail_lifetime: int = 50,
        new_ids_per_batch: int | None = None,
    ):
        if not vocab_sizes or min(vocab_sizes) < 1:
            raise ValueError(
                f"vocab_sizes must be a non-empty list of positive sizes, got {vocab_sizes!r}."
            )
        if id_space not in ID_SPACES:
            raise ValueError(f"id_space must be 'fixed' or 'open', got {id_space!r}.")
        if key_dtype not in KEY_DTYPES:
            raise ValueError(f"key_dtype must be 'int64' or 'string', got {key_dtype!r}.")
        if not 0.0 <= tail_fraction < 1.0:
            raise ValueError(f"tail_fraction must be in [0, 1), got {tail_fraction!r}.")
        if tail_lifetime < 1 or (new_ids_per_batch is not None and new_ids_per_batch < 1):
            raise ValueError(
                f"tail_lifetime and new_ids_per_batch must be >= 1, got {tail_lifetime!r} and "
                f"{new_ids_per_batch!r}."
            )
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        self.num_dense = num_dense
        self.seed = seed
        self.id_weight_scale = id_weight_scale
        self.dense_weight_scale = dense_weight_scale
        self.bias = bias
        self.id_skew = id_skew
        self.id_space = id_space
        self.key_dtype = key_dtype
        self.tail_fraction = tail_fraction
        self.tail_lifetime = int(tail_lifetime)
        self.new_ids_per_batch = new_ids_per_batch
        self._steps = [_coprime_step(v) for v in self.vocab_sizes]

    def ids(self, batch_index: tf.Tensor, batch_size: int) -> tf.Tensor:
        """The batch's categorical ids, int64 [batch_size, F] (whatever key_dtype is)."""
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(batch_index, tf.int64)])
        u = tf.random.stateless_uniform(
            [batch_size, len(self.vocab_sizes)], seed=seed, dtype=tf.float64
        )
        if self.id_space == "open":
            born = self.new_ids_per_batch or max(1, round(batch_size * self.tail_fraction))
            # the tail's uniforms: a stream of their own (the head's draws are those of 'fixed')
            tail_u = tf.random.stateless_uniform(
                [3, batch_size, len(self.vocab_sizes)], seed=seed + [0, 1 << 42], dtype=tf.float64
            )
        ids = []
        for f, (vocab, step) in enumerate(zip(self.vocab_sizes, self._steps)):
            rank = tf.minimum(
                tf.cast(tf.floor(vocab * tf.pow(u[:, f], self.id_skew)), tf.int64), vocab - 1
            )
            if self.id_space == "fixed":
                # scatter popular ranks over the vocabulary
                ids.append((rank * step + f * 7919) % vocab)
                continue
            birth = tf.cast(batch_index, tf.int64) - tf.cast(
                tf.floor(self.tail_lifetime * tail_u[1, :, f]), tf.int64
            )
            index = tf.cast(tf.floor(born * tail_u[2, :, f]), tf.uint64)
            # (birth, index) -> one rank, without overflow: splitmix64 is a bijection, and ranks
            # of two births are within `born` of each other with probability ~born / 2^64
            tail_rank = tf.bitcast(_splitmix64(tf.bitcast(birth, tf.uint64)) + index, tf.int64)
            in_tail = tail_u[0, :, f] < self.tail_fraction
            ids.append(tf.where(in_tail, mix_id(f, 1, tail_rank), mix_id(f, 0, rank)))
        return tf.stack(ids, axis=1)

    def features(self, batch_index: tf.Tensor, batch_size: int) -> dict[str, tf.Tensor]:
        return self._features(self.ids(batch_index, batch_size), batch_index, batch_size)

    def _features(self, ids: tf.Tensor, batch_index: tf.Tensor, batch_size: int) -> dict:
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(batch_index, tf.int64)])
        dense = tf.random.stateless_normal([batch_size, self.num_dense], seed=seed + [0, 1 << 40])
        categorical = hex_ids(ids) if self.key_dtype == "string" else ids
        return {"dense": dense, "categorical": categorical}

    def oracle_logits(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """The true logit of each example, [B, 1]: the best any model can do (int64 or hex ids)."""
        ids = features["categorical"]
        if ids.dtype == tf.string:
            ids = ids_from_hex(ids)
        logit = tf.fill([tf.shape(ids)[0]], tf.constant(self.bias, tf.float32))
        for f in range(len(self.vocab_sizes)):
            logit += hidden_weight(self.seed, f, ids[:, f], self.id_weight_scale)
        dense_w = hidden_weight(
            self.seed, 999, tf.range(self.num_dense, dtype=tf.int64), self.dense_weight_scale
        )
        logit += tf.linalg.matvec(features["dense"], dense_w)
        return logit[:, None]

    def batch(self, batch_index: tf.Tensor, batch_size: int):
        ids = self.ids(batch_index, batch_size)
        features = self._features(ids, batch_index, batch_size)
        p = tf.sigmoid(self.oracle_logits({**features, "categorical": ids}))
        seed = tf.stack(
            [tf.constant(self.seed, tf.int64), tf.cast(batch_index, tf.int64) + (1 << 41)]
        )
        clicks = tf.cast(tf.random.stateless_uniform(tf.shape(p), seed=seed) < p, tf.float32)
        return features, clicks

    def dataset(
        self,
        batch_size: int,
        *,
        first_batch: int = 0,
        num_batches: int | None = None,
        pipeline_id: int | tf.Tensor = 0,
        num_pipelines: int = 1,
    ) -> tf.data.Dataset:
        """Batches first_batch + pipeline_id, + num_pipelines, ...; forever when num_batches is None."""
        stop = None if num_batches is None else first_batch + num_batches
        indices = tf.data.Dataset.range(first_batch, stop if stop is not None else (1 << 62))
        if num_pipelines > 1:
            indices = indices.shard(num_pipelines, pipeline_id)
        return indices.map(
            lambda i: self.batch(i, batch_size),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )


# -- Criteo ------------------------------------------------------------------------

CRITEO_NUM_DENSE = 13
CRITEO_NUM_CATEGORICAL = 26


def parse_criteo_lines(
    lines: tf.Tensor,
    vocab_sizes: Sequence[int],
    num_dense: int = CRITEO_NUM_DENSE,
    key_dtype: str = "int64",
):
    """A batch of Criteo TSV lines -> (features, labels [B, 1]).

    key_dtype='int64': each categorical hashed into its feature's vocabulary (ids below
    vocab_sizes[f]); 'string': the raw strings as they are (vocab_sizes only counts the columns).
    """
    if key_dtype not in KEY_DTYPES:
        raise ValueError(f"key_dtype must be 'int64' or 'string', got {key_dtype!r}.")
    defaults = [[0.0]] + [[0.0]] * num_dense + [[""]] * len(vocab_sizes)
    columns = tf.io.decode_csv(
        lines, record_defaults=defaults, field_delim="\t", use_quote_delim=False
    )
    labels = tf.reshape(columns[0], [-1, 1])
    dense = tf.stack(columns[1 : 1 + num_dense], axis=1)
    dense = tf.math.log1p(tf.maximum(dense, 0.0))
    strings = columns[1 + num_dense :]
    if key_dtype == "int64":
        strings = [
            tf.strings.to_hash_bucket_fast(column, vocab)
            for column, vocab in zip(strings, vocab_sizes)
        ]
    return {"dense": dense, "categorical": tf.stack(strings, axis=1)}, labels


def criteo_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    vocab_sizes: Sequence[int],
    *,
    num_dense: int = CRITEO_NUM_DENSE,
    input_context: tf.distribute.InputContext | None = None,
    training: bool = True,
    shuffle_buffer: int = 100_000,
    key_dtype: str = "int64",
) -> tf.data.Dataset:
    """Criteo TSV files (plain text) -> batches; training data is sharded by file, shuffled and
    repeated. key_dtype: as in `parse_criteo_lines` ('string': the raw hex strings)."""
    files = tf.io.gfile.glob(file_pattern) if isinstance(file_pattern, str) else list(file_pattern)
    if not files:
        raise ValueError(
            f"no Criteo files match {file_pattern!r}; set ClickTrainer.criteo_train_files / "
            f"criteo_eval_files to existing TSV files."
        )
    dataset = tf.data.Dataset.from_tensor_slices(sorted(files))
    if (
        training
        and input_context is not None
        and 1 < input_context.num_input_pipelines <= len(files)
    ):
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    lines = dataset.interleave(
        tf.data.TextLineDataset,
        cycle_length=min(4, len(files)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not training,
    )
    if training:
        if input_context is not None and input_context.num_input_pipelines > len(files):
            lines = lines.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        lines = lines.shuffle(shuffle_buffer).repeat()
    lines = lines.batch(batch_size, drop_remainder=training)
    return lines.map(
        lambda batch: parse_criteo_lines(batch, vocab_sizes, num_dense, key_dtype),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
