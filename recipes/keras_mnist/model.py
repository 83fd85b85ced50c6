"""A compiled Keras model and its data functions: the MNIST recipe without a Trainer subclass.

Nothing here knows about distribution: `configs/keras_mnist.gin` names these
functions for `KerasTrainer`, and a strategy gin file picks how they run.
The model is the one a Keras user already has, `model.compile(...)` included;
its loss, optimizer and metrics are what training uses.
"""

from __future__ import annotations

import gin
import keras
import tensorflow as tf

from recipes.mnist import data as mnist_data
from tfdist_trainer import shard


@gin.configurable
def mnist_model(
    *, learning_rate: float = 1e-3, filters: tuple[int, int] = (32, 64), dense_units: int = 128
) -> keras.Model:
    """A two-convolution CNN, compiled. Called under the strategy's scope: compile here.

    Named layers give variables names that do not depend on how many models a
    process built before (`WarmStart.vars_regex = 'conv_.*'` finds them).
    """
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(filters[0], 3, activation="relu", name="conv_1"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(filters[1], 3, activation="relu", name="conv_2"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(dense_units, activation="relu", name="hidden"),
            keras.layers.Dense(mnist_data.NUM_CLASSES, name="logits"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@gin.configurable
def mnist_split(
    split: str,
    *,
    data_source: str = "auto",
    idx_dir: str | None = None,
    tfds_data_dir: str | None = None,
) -> tf.data.Dataset:
    """MNIST's `split`, normalized (IDX files, TFDS, or the labelled offline digits; see recipes.mnist.data)."""
    dataset, _ = mnist_data.load_mnist(
        split, source=data_source, idx_dir=idx_dir, tfds_data_dir=tfds_data_dir
    )
    return dataset.map(mnist_data.normalize, num_parallel_calls=tf.data.AUTOTUNE)


@gin.configurable
def mnist_train_data(
    input_context: tf.distribute.InputContext, batch_size: int, *, shuffle_buffer: int = 10_000
) -> tf.data.Dataset:
    """This pipeline's share of the training split, shuffled, repeated, batched by `batch_size`."""
    dataset = shard(mnist_split("train"), input_context)
    return dataset.cache().shuffle(shuffle_buffer).repeat().batch(batch_size, drop_remainder=True)


@gin.configurable
def mnist_eval_data(input_context: tf.distribute.InputContext, batch_size: int) -> tf.data.Dataset:
    """The whole test split, batched by `batch_size`."""
    return mnist_split("test").batch(batch_size).cache()
