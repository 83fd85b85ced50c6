"""The resnet_cnn recipe: a ResNet-style image classifier with BatchNormalization.

A stem convolution, stages of residual blocks (two 3x3 convolutions with
BatchNormalization, a 1x1 projection where the shape changes), global average
pooling and a float32 classifier. Every piece is a named layer that builds its
sublayers in ``build()``, so a ``model_parallel`` plan can place it (docs/design.md:
variables land on the device current when a layer is built).

The data is synthetic and learnable, made on the fly by tf.data from each
example's index (nothing to download): every class has a fixed random image
template, and an example is its class's template plus noise. BatchNorm's
moving statistics, the skip additions and the gradient sums of a real CNN are
what this recipe brings to the model zoo; its accuracy says only that the
loop trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import gin
import keras
import tensorflow as tf

from tfdist_trainer import Trainer, shard


class ResidualBlock(keras.layers.Layer):
    """relu(x + bn(conv(relu(bn(conv(x)))))), with a 1x1 projection when stride or width change."""

    def __init__(self, filters: int, stride: int = 1, regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.stride = stride
        self.regularizer = regularizer
        conv = dict(padding="same", use_bias=False, kernel_regularizer=regularizer)
        self.conv1 = keras.layers.Conv2D(filters, 3, strides=stride, name="conv1", **conv)
        self.bn1 = keras.layers.BatchNormalization(name="bn1")
        self.conv2 = keras.layers.Conv2D(filters, 3, name="conv2", **conv)
        self.bn2 = keras.layers.BatchNormalization(name="bn2")
        self.project = None

    def build(self, input_shape):
        batch, height, width, channels = input_shape
        out_shape = (batch, -(-height // self.stride), -(-width // self.stride), self.filters)
        self.conv1.build(input_shape)
        self.bn1.build(out_shape)
        self.conv2.build(out_shape)
        self.bn2.build(out_shape)
        if self.stride != 1 or channels != self.filters:
            self.project = keras.layers.Conv2D(
                self.filters,
                1,
                strides=self.stride,
                use_bias=False,
                kernel_regularizer=self.regularizer,
                name="project",
            )
            self.project.build(input_shape)

    def call(self, x, training=False):
        h = keras.ops.relu(self.bn1(self.conv1(x), training=training))
        h = self.bn2(self.conv2(h), training=training)
        shortcut = self.project(x) if self.project is not None else x
        return keras.ops.relu(h + shortcut)


class Stem(keras.layers.Layer):
    """conv 3x3 -> BatchNorm -> relu."""

    def __init__(self, filters: int, regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.conv = keras.layers.Conv2D(
            filters, 3, padding="same", use_bias=False, kernel_regularizer=regularizer, name="conv"
        )
        self.bn = keras.layers.BatchNormalization(name="bn")

    def build(self, input_shape):
        self.conv.build(input_shape)
        self.bn.build(tuple(input_shape[:-1]) + (self.filters,))

    def call(self, x, training=False):
        return keras.ops.relu(self.bn(self.conv(x), training=training))


class Classifier(keras.layers.Layer):
    """Global average pooling and the float32 logits (also under mixed precision)."""

    def __init__(self, num_classes: int, regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.logits = keras.layers.Dense(
            num_classes, dtype="float32", kernel_regularizer=regularizer, name="logits"
        )

    def build(self, input_shape):
        self.logits.build((input_shape[0], input_shape[-1]))

    def call(self, x):
        return self.logits(keras.ops.mean(x, axis=(1, 2)))


class ResNetCNN(keras.Model):
    """stem -> stage{s}_block{b} ... -> head; the first block of each later stage halves the resolution."""

    def __init__(
        self,
        *,
        image_size: int,
        num_classes: int,
        stage_filters: Sequence[int],
        blocks_per_stage: int,
        weight_decay: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.image_size = image_size
        l2 = keras.regularizers.L2(weight_decay) if weight_decay else None
        self.stem = Stem(stage_filters[0], regularizer=l2, name="stem")
        self.blocks = [
            ResidualBlock(filters, 2 if s and not b else 1, l2, name=f"stage{s}_block{b}")
            for s, filters in enumerate(stage_filters)
            for b in range(blocks_per_stage)
        ]
        self.head = Classifier(num_classes, regularizer=l2, name="head")

    def build(self, input_shape):
        self.stem.build(input_shape)
        shape = tuple(input_shape[:-1]) + (self.stem.filters,)
        for block in self.blocks:
            block.build(shape)
            size = -(-shape[1] // block.stride)
            shape = (shape[0], size, size, block.filters)
        self.head.build(shape)

    def call(self, images, training=False):
        x = self.stem(images, training=training)
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(x)


@gin.configurable
class ResNetTrainer(Trainer):
    """A ResNet-style CNN on synthetic, learnable images.

    Args:
      image_size: height and width of the square RGB images.
      num_classes: classes (each has its own random template image).
      stage_filters: filters of each stage; stage s > 0 starts by halving the resolution.
      blocks_per_stage: residual blocks per stage.
      noise: standard deviation of the noise added to a class template (1.0: as strong as it).
      learning_rate: Adam's learning rate.
      weight_decay: L2 penalty on every convolution and dense kernel (0 for none).
      eval_examples: held-out examples (other indices than training's) in the evaluation set.
      data_seed: seed of the class templates and the noise.
      global_batch_size, eval_batch_size: Trainer's; None: its gin bindings
        (`Trainer.global_batch_size`) or defaults.
    """

    def __init__(
        self,
        *,
        image_size: int = 32,
        num_classes: int = 10,
        stage_filters: Sequence[int] = (32, 64, 128),
        blocks_per_stage: int = 2,
        noise: float = 1.0,
        learning_rate: float = 1e-3,
        weight_decay: float = 1e-4,
        eval_examples: int = 256,
        data_seed: int = 1234,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        if not stage_filters or blocks_per_stage < 1:
            raise ValueError(
                f"ResNetTrainer needs at least one stage and one block per stage, got "
                f"stage_filters={tuple(stage_filters)!r}, blocks_per_stage={blocks_per_stage}."
            )
        self.image_size = image_size
        self.num_classes = num_classes
        self.stage_filters = tuple(stage_filters)
        self.blocks_per_stage = blocks_per_stage
        self.noise = noise
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.eval_examples = eval_examples
        self.data_seed = data_seed

    def build_model(self) -> keras.Model:
        return ResNetCNN(
            image_size=self.image_size,
            num_classes=self.num_classes,
            stage_filters=self.stage_filters,
            blocks_per_stage=self.blocks_per_stage,
            weight_decay=self.weight_decay,
            name="resnet_cnn",
        )

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(self.learning_rate)

    def _examples(self, indices: tf.data.Dataset) -> tf.data.Dataset:
        size, classes, seed = self.image_size, self.num_classes, self.data_seed
        templates = tf.random.stateless_normal([classes, size, size, 3], seed=[seed, 0])

        def example(index):
            label = tf.cast(index % classes, tf.int32)
            noise = tf.random.stateless_normal([size, size, 3], seed=tf.stack([seed, index + 1]))
            return tf.gather(templates, label) + self.noise * noise, label

        return indices.map(example, num_parallel_calls=tf.data.AUTOTUNE)

    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Training indices count up from eval_examples: evaluation's examples are never trained on.
        indices = tf.data.Dataset.range(self.eval_examples, tf.int64.max)
        return self._examples(shard(indices, input_context)).batch(
            self.per_replica_batch_size(input_context), drop_remainder=True
        )

    def build_eval_dataset(
        self, input_context: tf.distribute.InputContext
    ) -> tf.data.Dataset | None:
        indices = tf.data.Dataset.range(self.eval_examples)
        return self._examples(indices).batch(self.eval_batch_size).cache()

    def compute_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
