"""`ShardedSoftmax`: a row-sharded output projection (full logits, or a sampled softmax loss)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.fixed.layer import ShardedLayerMixin, resolve_num_shards
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.layout import PARTITION_STRATEGIES, ShardLayout
from tfdist_trainer.sharding.saving import serializable


@serializable
class ShardedSoftmax(ShardedLayerMixin, keras.layers.Layer):
    """A row-sharded output projection over `num_classes` classes: full logits, or a sampled softmax loss.

    `call(x)` returns full logits [..., num_classes] (each shard's logits are
    computed next to the shard, then put in class order). For large
    vocabularies train with `sampled_loss(x, labels)`: it gathers only the
    rows of the true and sampled classes (sparse gradients), like
    `tf.nn.sampled_softmax_loss` over a sharded weight list.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        num_shards: int | None = None,
        partition_strategy: str = "div",
        devices: Sequence[str] | None = None,
        kernel_initializer: Any = "glorot_uniform",
        use_bias: bool = True,
        num_sampled: int = 64,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if partition_strategy not in PARTITION_STRATEGIES:
            raise ConfigError(
                f"{self.name}: partition_strategy must be 'div' or 'mod', got {partition_strategy!r}."
            )
        self.num_classes = int(num_classes)
        self.num_shards = num_shards
        self.partition_strategy = partition_strategy
        self.devices = list(devices) if devices else None
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.use_bias = use_bias
        self.num_sampled = num_sampled
        if num_shards is not None:
            resolve_num_shards(self.name, self.num_classes, num_shards, self.devices)

    def build(self, input_shape):
        dim = int(input_shape[-1])
        shards = resolve_num_shards(self.name, self.num_classes, self.num_shards, self.devices)
        layout = ShardLayout(self.num_classes, shards, self.partition_strategy)
        self._add_sharded(
            ShardedWeight(
                self,
                "kernel",
                layout,
                dim,
                self.kernel_initializer,
                self.devices,
                self.variable_dtype,
            ),
            "kernel",
        )
        if self.use_bias:
            self._add_sharded(
                ShardedWeight(self, "bias", layout, 1, "zeros", self.devices, self.variable_dtype),
                "bias",
            )
        self.built = True

    @property
    def kernel(self) -> ShardedWeight:
        return self.sharded_weights()[0]

    @property
    def bias(self) -> ShardedWeight | None:
        return self.sharded_weights()[1] if self.use_bias else None

    def call(self, inputs):
        x = tf.cast(inputs, self.variable_dtype)
        kernels = self.kernel.tf_variables()
        biases = self.bias.tf_variables() if self.use_bias else [None] * len(kernels)
        parts = []
        for w, b in zip(kernels, biases):
            # the shard's logits next to the shard: x goes there, logits come back
            with tf.device(w.device):
                logits = tf.matmul(x, w, transpose_b=True)
                if b is not None:
                    logits += tf.reshape(b, [-1])
            parts.append(logits)
        logits = tf.concat(parts, axis=-1) if len(parts) > 1 else parts[0]
        if self.partition_strategy == "mod" and len(parts) > 1:
            # Column of class c in the concatenation: rows before its shard plus its local row.
            layout = self.kernel.layout
            starts = np.cumsum([0] + [layout.rows(i) for i in range(layout.num_shards)])[:-1]
            classes = tf.range(self.num_classes, dtype=tf.int64)
            shard, local = layout.assign(classes)
            logits = tf.gather(
                logits, tf.gather(tf.constant(starts, tf.int64), shard) + local, axis=-1
            )
        return tf.cast(logits, self.compute_dtype)

    def sampled_loss(
        self,
        inputs,
        labels,
        *,
        num_sampled: int | None = None,
        sampled_values=None,
        remove_accidental_hits: bool = True,
        seed: int | None = None,
    ):
        """Per-example sampled softmax loss (log-uniform candidates), as `tf.nn.sampled_softmax_loss`.

        Args:
          inputs: [batch, dim] activations.
          labels: [batch] or [batch, 1] integer classes.
          sampled_values: optional (sampled, true_expected, sampled_expected) from a candidate sampler.
        """
        if not self.built:
            self.build(inputs.shape)
        x = tf.cast(inputs, self.variable_dtype)
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        num_sampled = num_sampled or self.num_sampled
        if sampled_values is None and tf_compat.in_xla_compile():
            raise ConfigError(
                f"{self.name}: sampled_loss draws its classes with "
                f"tf.random.log_uniform_candidate_sampler, which XLA cannot compile "
                f"(train.jit_compile=True, or a jit_compile function); pass sampled_values "
                f"drawn outside the compiled step (in the input pipeline), or do not compile it."
            )
        if sampled_values is None:
            sampled_values = tf.random.log_uniform_candidate_sampler(
                true_classes=labels[:, None],
                num_true=1,
                num_sampled=num_sampled,
                unique=True,
                range_max=self.num_classes,
                seed=seed,
            )
        sampled, true_expected, sampled_expected = (tf.stop_gradient(t) for t in sampled_values)
        sampled = tf.cast(sampled, tf.int64)
        batch = tf.shape(labels)[0]
        all_ids = tf.concat([labels, sampled], 0)
        weights = self.kernel.gather(all_ids)
        true_w, sampled_w = weights[:batch], weights[batch:]
        true_logits = tf.reduce_sum(x * true_w, axis=-1)
        sampled_logits = tf.matmul(x, sampled_w, transpose_b=True)
        if self.use_bias:
            bias = tf.reshape(self.bias.gather(all_ids), [-1])
            true_logits += bias[:batch]
            sampled_logits += bias[batch:]
        true_logits -= tf.math.log(tf.reshape(tf.cast(true_expected, x.dtype), [-1]))
        sampled_logits -= tf.math.log(tf.cast(sampled_expected, x.dtype))
        if remove_accidental_hits:
            sampled_logits += _accidental_hits(labels, sampled, sampled_logits)
        logits = tf.concat([true_logits[:, None], sampled_logits], 1)
        targets = tf.concat([tf.ones_like(true_logits[:, None]), tf.zeros_like(sampled_logits)], 1)
        return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_classes,)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_classes=self.num_classes,
            num_shards=self.num_shards,
            partition_strategy=self.partition_strategy,
            devices=self.devices,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            use_bias=self.use_bias,
            num_sampled=self.num_sampled,
        )
        return config


def _accidental_hits(labels: tf.Tensor, sampled: tf.Tensor, sampled_logits: tf.Tensor) -> tf.Tensor:
    """What removes a sampled class equal to the example's true class from its logits: the
    lowest float there (`tf.nn.compute_accidental_hits`' weights), 0 elsewhere.

    Inside an XLA compile, one comparison of every label with every sampled class:
    `ComputeAccidentalHits` has no XLA kernel, and its output's size is known only at run time.
    """
    if tf_compat.in_xla_compile():
        hit = tf.equal(labels[:, None], sampled[None, :])
        lowest = tf.constant(sampled_logits.dtype.min, sampled_logits.dtype)
        return tf.where(hit, lowest, tf.zeros_like(sampled_logits))
    indices, ids, weights = tf.nn.compute_accidental_hits(labels[:, None], sampled, num_true=1)
    return tf.scatter_nd(
        tf.stack([indices, tf.cast(ids, tf.int32)], 1),
        tf.cast(weights, sampled_logits.dtype),
        tf.shape(sampled_logits),
    )
