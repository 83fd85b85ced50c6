"""The model_parallel_lm recipe: a byte-level decoder-only Transformer LM on local text files.

The model is a stack of named layers -- ``embed``, ``block_0`` ... ``block_{L-1}``,
``head`` -- so a ``model_parallel.plan`` can place them by name
(``{'embed': 0, 'block_[0-1]': 0, 'block_[2-3]': 1, 'head': 1}``) or balance them
('auto'). Each layer builds its sublayers in ``build()`` (docs/design.md: variables land
on the device current when a layer is built). Tokens are bytes (vocabulary 256),
so any local text works and nothing is downloaded.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import Trainer, shard

VOCAB_SIZE = 256  # bytes


class TokenAndPositionEmbedding(keras.layers.Layer):
    """Byte embedding plus a learned position embedding."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        self.max_len = max_len
        self.tokens = keras.layers.Embedding(vocab_size, d_model, name="tokens")
        self.positions = keras.layers.Embedding(max_len, d_model, name="positions")

    def build(self, input_shape):
        self.tokens.build(input_shape)
        self.positions.build((self.max_len,))

    def call(self, ids):
        positions = keras.ops.arange(keras.ops.shape(ids)[-1])
        return self.tokens(ids) + self.positions(positions)


class TransformerBlock(keras.layers.Layer):
    """Pre-norm block: x + attention(norm(x)) with a causal mask, then x + MLP(norm(x))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(
                f"TransformerLMTrainer.d_model={d_model} is not divisible by num_heads={num_heads}."
            )
        self.ln_attn = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_attn")
        self.attn = keras.layers.MultiHeadAttention(
            num_heads, key_dim=d_model // num_heads, dropout=dropout, name="attn"
        )
        self.ln_mlp = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_mlp")
        self.mlp_in = keras.layers.Dense(d_ff, activation="gelu", name="mlp_in")
        self.mlp_out = keras.layers.Dense(d_model, name="mlp_out")
        self.dropout = keras.layers.Dropout(dropout)
        self.d_ff = d_ff

    def build(self, input_shape):
        self.ln_attn.build(input_shape)
        self.attn.build(input_shape, input_shape)
        self.ln_mlp.build(input_shape)
        self.mlp_in.build(input_shape)
        self.mlp_out.build(tuple(input_shape[:-1]) + (self.d_ff,))

    def call(self, x, training=False):
        h = self.ln_attn(x)
        x = x + self.dropout(
            self.attn(h, h, use_causal_mask=True, training=training), training=training
        )
        h = self.ln_mlp(x)
        return x + self.dropout(self.mlp_out(self.mlp_in(h)), training=training)


class LMHead(keras.layers.Layer):
    """Final norm and the projection to byte logits (float32, also under mixed precision)."""

    def __init__(self, vocab_size: int, **kwargs):
        super().__init__(**kwargs)
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5, name="ln")
        self.logits = keras.layers.Dense(vocab_size, dtype="float32", name="logits")

    def build(self, input_shape):
        self.ln.build(input_shape)
        self.logits.build(input_shape)

    def call(self, x):
        return self.logits(self.ln(x))


class TransformerLM(keras.Model):
    """embed -> block_0 ... block_{L-1} -> head; every piece a named layer a plan can place."""

    def __init__(
        self,
        *,
        seq_len: int,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        vocab_size: int = VOCAB_SIZE,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.embed = TokenAndPositionEmbedding(vocab_size, seq_len, d_model, name="embed")
        self.blocks = [
            TransformerBlock(d_model, num_heads, d_ff, dropout, name=f"block_{i}")
            for i in range(num_layers)
        ]
        self.head = LMHead(vocab_size, name="head")

    def build(self, input_shape):
        self.embed.build(input_shape)
        hidden = tuple(input_shape) + (self.d_model,)
        for block in self.blocks:
            block.build(hidden)
        self.head.build(hidden)

    def call(self, ids, training=False):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(x)


def find_files(patterns: str | Sequence[str]) -> list[str]:
    """Files matching the glob(s) (``**`` recurses), sorted; a glob matching nothing is a ValueError."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    files = sorted(
        {
            f
            for p in patterns
            for f in glob.glob(os.path.expanduser(p), recursive=True)
            if os.path.isfile(f)
        }
    )
    if not files:
        raise ValueError(
            f"TransformerLMTrainer.data_glob={patterns!r} matches no file (working directory "
            f"{os.getcwd()}); point it at local text files."
        )
    return files


def load_bytes(patterns: str | Sequence[str]) -> np.ndarray:
    """All matching files' bytes, one file after another (uint8)."""
    chunks = []
    for path in find_files(patterns):
        with open(path, "rb") as f:
            chunks.append(f.read())
    return np.frombuffer(b"\n".join(chunks), dtype=np.uint8)


@gin.configurable
class TransformerLMTrainer(Trainer):
    """A decoder-only Transformer language model on the bytes of local text files.

    Args:
      data_glob: a glob or list of globs of text files (relative to the working directory).
      eval_fraction: the end of the text held out for evaluation.
      seq_len: bytes per example (the model predicts each next byte).
      num_layers, d_model, num_heads, d_ff, dropout: the Transformer's shape.
      optimizer: 'adam' or 'sgd' (plain SGD: runs compared step by step stay within float noise,
        where Adam's first steps magnify it).
      learning_rate: the optimizer's learning rate.
      shuffle_buffer: examples held for shuffling (shuffled with `data_seed`, the same in every run).
      max_eval_batches: evaluation reads at most this many batches.
      global_batch_size, eval_batch_size: Trainer's; None: its gin bindings
        (`Trainer.global_batch_size`) or defaults.
    """

    def __init__(
        self,
        *,
        data_glob: str | Sequence[str] = ("*.md", "tfdist_trainer/*.py"),
        eval_fraction: float = 0.05,
        seq_len: int = 128,
        num_layers: int = 4,
        d_model: int = 128,
        num_heads: int = 4,
        d_ff: int = 512,
        dropout: float = 0.0,
        optimizer: str = "adam",
        learning_rate: float = 1e-3,
        shuffle_buffer: int = 10_000,
        data_seed: int = 1234,
        max_eval_batches: int = 20,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(
                f"TransformerLMTrainer.eval_fraction must be in (0, 1), got {eval_fraction}."
            )
        if optimizer not in ("adam", "sgd"):
            raise ValueError(
                f"TransformerLMTrainer.optimizer must be 'adam' or 'sgd', got {optimizer!r}."
            )
        self.data_glob = data_glob
        self.optimizer_name = optimizer
        self.eval_fraction = eval_fraction
        self.seq_len = seq_len
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.learning_rate = learning_rate
        self.shuffle_buffer = shuffle_buffer
        self.data_seed = data_seed
        self.max_eval_batches = max_eval_batches
        self._windows: dict[str, np.ndarray] = {}

    def _split(self, split: str) -> np.ndarray:
        """[N, seq_len + 1] non-overlapping byte windows of the train or eval part of the text."""
        if not self._windows:
            data = load_bytes(self.data_glob)
            cut = int(len(data) * (1.0 - self.eval_fraction))
            width = self.seq_len + 1
            for name, part in (("train", data[:cut]), ("eval", data[cut:])):
                n = len(part) // width
                self._windows[name] = part[: n * width].reshape(n, width).astype(np.int32)
            if len(self._windows["train"]) < self.global_batch_size:
                raise ValueError(
                    f"TransformerLMTrainer.data_glob={self.data_glob!r} gives only "
                    f"{len(self._windows['train'])} training windows of {width} bytes, fewer than "
                    f"Trainer.global_batch_size={self.global_batch_size}; add text or shrink seq_len."
                )
        return self._windows[split]

    @staticmethod
    def _inputs_and_targets(window):
        return window[..., :-1], window[..., 1:]

    def record_tags(self) -> dict[str, str]:
        return {"data": f"{len(find_files(self.data_glob))} file(s) by {self.data_glob!r}"}

    def build_model(self) -> keras.Model:
        return TransformerLM(
            seq_len=self.seq_len,
            num_layers=self.num_layers,
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            name="transformer_lm",
        )

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        if self.optimizer_name == "sgd":
            return keras.optimizers.SGD(self.learning_rate)
        return keras.optimizers.Adam(self.learning_rate)

    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = shard(tf.data.Dataset.from_tensor_slices(self._split("train")), input_context)
        return (
            dataset.shuffle(self.shuffle_buffer, seed=self.data_seed)
            .repeat()
            .batch(self.per_replica_batch_size(input_context), drop_remainder=True)
            .map(self._inputs_and_targets)
        )

    def build_eval_dataset(
        self, input_context: tf.distribute.InputContext
    ) -> tf.data.Dataset | None:
        windows = self._split("eval")
        if not len(windows):
            return None
        return (
            tf.data.Dataset.from_tensor_slices(windows)
            .batch(self.eval_batch_size)
            .take(self.max_eval_batches)
            .map(self._inputs_and_targets)
            .cache()
        )

    def compute_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        per_token = keras.losses.sparse_categorical_crossentropy(
            labels, keras.ops.cast(logits, "float32"), from_logits=True
        )
        return keras.ops.mean(per_token, axis=-1)  # one loss per example (sequence)

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
