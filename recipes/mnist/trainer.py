"""The MNIST recipe: a small CNN Trainer that runs unchanged under every strategy."""

from __future__ import annotations

import gin
import keras
import tensorflow as tf

from recipes.mnist import data as mnist_data
from tfdist_trainer import Trainer, shard


@gin.configurable
class MnistTrainer(Trainer):
    """A two-convolution CNN on MNIST (or the labelled offline fallback).

    Args:
      data_source: 'auto', 'tfds', 'idx' or 'digits' (see recipes.mnist.data.load_mnist).
      tfds_data_dir: where TFDS has prepared ``mnist``.
      idx_dir: a directory with the four MNIST IDX files, gzipped or not.
      learning_rate: Adam's learning rate.
      filters: channels of the two convolutions; small values keep tests fast.
      shuffle_buffer: examples held for shuffling the training data.
      global_batch_size, eval_batch_size: Trainer's; None: its gin bindings
        (`Trainer.global_batch_size`) or defaults.
    """

    def __init__(
        self,
        *,
        data_source: str = "auto",
        tfds_data_dir: str | None = None,
        idx_dir: str | None = None,
        learning_rate: float = 1e-3,
        filters: tuple[int, int] = (32, 64),
        dense_units: int = 128,
        shuffle_buffer: int = 10_000,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        self.data_source = data_source
        self.tfds_data_dir = tfds_data_dir
        self.idx_dir = idx_dir
        self.learning_rate = learning_rate
        self.filters = tuple(filters)
        self.dense_units = dense_units
        self.shuffle_buffer = shuffle_buffer
        self._source_label: str | None = None
        self._loaded: dict[str, tf.data.Dataset] = {}

    def _load(self, split: str) -> tf.data.Dataset:
        """Finds the data once per split; every pipeline built afterwards reuses it."""
        if split not in self._loaded:
            self._loaded[split], self._source_label = mnist_data.load_mnist(
                split,
                source=self.data_source,
                tfds_data_dir=self.tfds_data_dir,
                idx_dir=self.idx_dir,
            )
        return self._loaded[split]

    def record_tags(self) -> dict[str, str]:
        """Every report names the data, so a fallback run can never pass as MNIST."""
        if self._source_label is None:
            self._load("test")
        return {"data": self._source_label}

    def build_model(self) -> keras.Model:
        return keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(self.filters[0], 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(self.filters[1], 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(self.dense_units, activation="relu"),
                keras.layers.Dense(10),
            ]
        )

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(self.learning_rate)

    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = shard(self._load("train"), input_context)
        return (
            dataset.map(mnist_data.normalize, num_parallel_calls=tf.data.AUTOTUNE)
            .cache()
            .shuffle(self.shuffle_buffer)
            .repeat()
            .batch(self.per_replica_batch_size(input_context), drop_remainder=True)
        )

    def build_eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return (
            self._load("test")
            .map(mnist_data.normalize, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(self.eval_batch_size)
            .cache()
        )

    def compute_loss(self, labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
        return keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
