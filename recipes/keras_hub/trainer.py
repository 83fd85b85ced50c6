"""Models nobody here wrote: keras-hub's GPT-2 causal LM and BERT classifier, built from config.

The check that the Trainer API and every strategy fit real third-party Keras
models: nested functional backbones, custom layers (keras-hub's
``TransformerDecoder``, ``ReversibleEmbedding``), and tied weights (GPT-2's
token embedding is also its language-model head). The weights are random
(``*Backbone(...)`` from its config, no preset, nothing downloaded) and the data
is generated, so a run needs no network.

The data is learnable, so a falling loss means the model trains:

- GPT-2: each sequence counts up from a random token by a random stride, modulo
  the vocabulary; the next token follows from the last two.
- BERT: a sequence of label 1 draws its tokens from the upper half of the
  vocabulary, one of label 0 from the lower half.

keras-hub is a test dependency (``pip install keras-hub``): importing this module
without it is one clear ImportError.
"""

from __future__ import annotations

import gin
import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import Trainer, shard

try:
    import keras_hub
except ImportError as e:  # pragma: no cover - the suite installs it
    raise ImportError(
        "recipes.keras_hub needs the keras-hub package: pip install 'keras-hub>=0.32'."
    ) from e


class _KerasHubTrainer(Trainer):
    """What both models share: the backbone's shape, generated data, Adam.

    global_batch_size and eval_batch_size are Trainer's, passed on only when given, so that
    `Trainer.global_batch_size` in gin applies otherwise.
    """

    def __init__(
        self,
        *,
        vocabulary_size: int = 1000,
        num_layers: int = 2,
        num_heads: int = 4,
        hidden_dim: int = 128,
        intermediate_dim: int = 512,
        seq_len: int = 128,
        dropout: float = 0.0,
        learning_rate: float = 1e-3,
        num_examples: int = 4096,
        data_seed: int = 1234,
        use_ema: bool = False,
        global_clipnorm: float | None = None,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        self.use_ema = use_ema
        self.global_clipnorm = global_clipnorm
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.seq_len = seq_len
        self.dropout = dropout
        self.learning_rate = learning_rate
        self.num_examples = num_examples
        self.data_seed = data_seed

    def backbone_config(self) -> dict:
        return {
            "vocabulary_size": self.vocabulary_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "max_sequence_length": self.seq_len,
        }

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(
            self.learning_rate, use_ema=self.use_ema, global_clipnorm=self.global_clipnorm
        )

    def examples(self, split: str) -> tuple[dict, np.ndarray]:
        raise NotImplementedError

    def _dataset(self, split: str) -> tf.data.Dataset:
        features, labels = self.examples(split)
        return tf.data.Dataset.from_tensor_slices((features, labels))

    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return (
            shard(self._dataset("train"), input_context)
            .shuffle(self.num_examples, seed=self.data_seed)
            .repeat()
            .batch(self.per_replica_batch_size(input_context), drop_remainder=True)
        )

    def build_eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return self._dataset("eval").batch(self.eval_batch_size).take(2).cache()


@gin.configurable
class GPT2LMTrainer(_KerasHubTrainer):
    """keras-hub ``GPT2CausalLM`` around a ``GPT2Backbone`` built from config (tied LM head)."""

    def build_model(self) -> keras.Model:
        backbone = keras_hub.models.GPT2Backbone(**self.backbone_config())
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

    def examples(self, split: str) -> tuple[dict, np.ndarray]:
        rng = np.random.default_rng(self.data_seed + (split == "eval"))
        n = self.num_examples if split == "train" else 64
        start = rng.integers(0, self.vocabulary_size, size=(n, 1))
        stride = rng.integers(1, 8, size=(n, 1))
        tokens = (start + stride * np.arange(self.seq_len + 1)) % self.vocabulary_size
        tokens = tokens.astype(np.int32)
        features = {
            "token_ids": tokens[:, :-1],
            "padding_mask": np.ones((n, self.seq_len), dtype=np.int32),
        }
        return features, tokens[:, 1:]

    def compute_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        per_token = keras.losses.sparse_categorical_crossentropy(
            labels, keras.ops.cast(logits, "float32"), from_logits=True
        )
        return keras.ops.mean(per_token, axis=-1)


@gin.configurable
class BertClassifierTrainer(_KerasHubTrainer):
    """keras-hub ``BertTextClassifier`` around a ``BertBackbone`` built from config (2 classes)."""

    def build_model(self) -> keras.Model:
        backbone = keras_hub.models.BertBackbone(**self.backbone_config())
        return keras_hub.models.BertTextClassifier(
            backbone=backbone, num_classes=2, preprocessor=None, dropout=self.dropout
        )

    def examples(self, split: str) -> tuple[dict, np.ndarray]:
        rng = np.random.default_rng(self.data_seed + (split == "eval"))
        n = self.num_examples if split == "train" else 64
        labels = rng.integers(0, 2, size=(n,)).astype(np.int32)
        half = self.vocabulary_size // 2
        tokens = rng.integers(0, half, size=(n, self.seq_len)) + half * labels[:, None]
        tokens = tokens.astype(np.int32)
        features = {
            "token_ids": tokens,
            "segment_ids": np.zeros_like(tokens),
            "padding_mask": np.ones_like(tokens),
        }
        return features, labels

    def compute_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return keras.losses.sparse_categorical_crossentropy(
            labels, keras.ops.cast(logits, "float32"), from_logits=True
        )

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
