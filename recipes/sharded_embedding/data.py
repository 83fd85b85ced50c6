"""Click data for the sharded-embedding recipe: a synthetic generator with a real signal, and Criteo TSV.

Both yield batches of ``({"dense": float32 [B, num_dense], "categorical": int64
[B, F]}, label float32 [B, 1])``.

Synthetic clicks: every (feature, id) has a hidden weight, and so does every
dense feature; a click is drawn from a logistic model over their sum. The
weights are a hash of (seed, feature, id) computed with TF integer ops, so
nothing big is captured in the graph, every example is a pure function of
(seed, batch index), and any number of workers can generate disjoint batches.
Ids are Zipf-like (a few ids are frequent, as in real logs) and scattered over
the whole vocabulary, so popular rows do not all fall into one shard. A model
that learns the per-id weights reaches the AUC of the true logits
(`oracle_logits`); a model that learns nothing gets 0.5.

Criteo (Display Advertising Challenge / Criteo 1TB day files): tab-separated
label, 13 integer features, 26 categorical features (8 hex digits or empty).
Integers become log(1 + max(x, 0)); categoricals are hashed into each
feature's vocabulary (`tf.strings.to_hash_bucket_fast`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tensorflow as tf

_M = 2147483647  # 2^31 - 1: products of two values below it fit in int64
_A = 48271


def _mix(x: tf.Tensor) -> tf.Tensor:
    """A few rounds of Park-Miller plus xor-shift on int64 values in [1, 2^31 - 1)."""
    for shift in (13, 7, 17):
        x = (x * _A) % _M
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift)) % _M
        x = tf.maximum(x, 1)
    return (x * _A) % _M


def hash_uniform(seed: int, stream: int, values: tf.Tensor) -> tf.Tensor:
    """A deterministic uniform in (0, 1) for each int64 value, per (seed, stream)."""
    values = tf.cast(values, tf.int64)
    x = (values % _M * 40503 + (stream * 7919 + seed * 104729 + 1) % _M) % _M + 1
    return (tf.cast(_mix(x), tf.float64) + 0.5) / _M


def hidden_weight(seed: int, feature: int, ids: tf.Tensor, scale: float) -> tf.Tensor:
    """The hidden weight of each id of categorical feature `feature`: N(0, scale^2), fixed by the seed."""
    return tf.cast(scale * tf.math.ndtri(hash_uniform(seed, 1000 + feature, ids)), tf.float32)


def _coprime_step(vocab: int) -> int:
    step = 2654435761 % vocab or 1
    while math.gcd(step, vocab) != 1:
        step += 1
    return step


class SyntheticClicks:
    """Generates click batches from a hidden logistic model (see the module docstring).

    Args:
      vocab_sizes: ids per categorical feature.
      num_dense: dense features (standard normal).
      seed: fixes the hidden weights; the examples are fixed by (seed, batch index).
      id_weight_scale: standard deviation of the hidden per-id weights.
      dense_weight_scale: standard deviation of the hidden dense weights.
      bias: the logit's offset (-2.0 gives about 30% clicks).
      id_skew: ids are vocab * u**id_skew for uniform u (1: uniform ids; larger: more skewed).
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
    ):
        if not vocab_sizes or min(vocab_sizes) < 1:
            raise ValueError(
                f"vocab_sizes must be a non-empty list of positive sizes, got {vocab_sizes!r}."
            )
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        self.num_dense = num_dense
        self.seed = seed
        self.id_weight_scale = id_weight_scale
        self.dense_weight_scale = dense_weight_scale
        self.bias = bias
        self.id_skew = id_skew
        self._steps = [_coprime_step(v) for v in self.vocab_sizes]

    def features(self, batch_index: tf.Tensor, batch_size: int) -> dict[str, tf.Tensor]:
        seed = tf.stack([tf.constant(self.seed, tf.int64), tf.cast(batch_index, tf.int64)])
        u = tf.random.stateless_uniform(
            [batch_size, len(self.vocab_sizes)], seed=seed, dtype=tf.float64
        )
        ids = []
        for f, (vocab, step) in enumerate(zip(self.vocab_sizes, self._steps)):
            rank = tf.minimum(
                tf.cast(tf.floor(vocab * tf.pow(u[:, f], self.id_skew)), tf.int64), vocab - 1
            )
            # scatter popular ranks over the vocabulary
            ids.append((rank * step + f * 7919) % vocab)
        dense = tf.random.stateless_normal([batch_size, self.num_dense], seed=seed + [0, 1 << 40])
        return {"dense": dense, "categorical": tf.stack(ids, axis=1)}

    def oracle_logits(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """The true logit of each example, [B, 1]: the best any model can do."""
        ids = features["categorical"]
        logit = tf.fill([tf.shape(ids)[0]], tf.constant(self.bias, tf.float32))
        for f in range(len(self.vocab_sizes)):
            logit += hidden_weight(self.seed, f, ids[:, f], self.id_weight_scale)
        dense_w = hidden_weight(
            self.seed, 999, tf.range(self.num_dense, dtype=tf.int64), self.dense_weight_scale
        )
        logit += tf.linalg.matvec(features["dense"], dense_w)
        return logit[:, None]

    def batch(self, batch_index: tf.Tensor, batch_size: int):
        features = self.features(batch_index, batch_size)
        p = tf.sigmoid(self.oracle_logits(features))
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
    lines: tf.Tensor, vocab_sizes: Sequence[int], num_dense: int = CRITEO_NUM_DENSE
):
    """A batch of Criteo TSV lines -> (features, labels [B, 1])."""
    defaults = [[0.0]] + [[0.0]] * num_dense + [[""]] * len(vocab_sizes)
    columns = tf.io.decode_csv(
        lines, record_defaults=defaults, field_delim="\t", use_quote_delim=False
    )
    labels = tf.reshape(columns[0], [-1, 1])
    dense = tf.stack(columns[1 : 1 + num_dense], axis=1)
    dense = tf.math.log1p(tf.maximum(dense, 0.0))
    categorical = tf.stack(
        [
            tf.strings.to_hash_bucket_fast(column, vocab)
            for column, vocab in zip(columns[1 + num_dense :], vocab_sizes)
        ],
        axis=1,
    )
    return {"dense": dense, "categorical": categorical}, labels


def criteo_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    vocab_sizes: Sequence[int],
    *,
    num_dense: int = CRITEO_NUM_DENSE,
    input_context: tf.distribute.InputContext | None = None,
    training: bool = True,
    shuffle_buffer: int = 100_000,
) -> tf.data.Dataset:
    """Criteo TSV files (plain text) -> batches; training data is sharded by file, shuffled and repeated."""
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
        lambda batch: parse_criteo_lines(batch, vocab_sizes, num_dense),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
