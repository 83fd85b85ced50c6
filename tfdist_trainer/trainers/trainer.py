"""`Trainer`: the methods a user overrides to describe a model, its data and its loss.

A Trainer says *what* to train, never *how* it is distributed: the same
subclass runs under every strategy because the loops (tfdist_trainer.runtime.loops)
call its steps inside `strategy.run` and hand it an `InputContext` for its
data. The runtime objects (model, optimizer, metrics) are created by the
runner under the strategy's scope and attached to the Trainer before any step
runs.

A model that `build_model` returns compiled (`model.compile(optimizer=...,
loss=..., metrics=...)`) brings its own loss, optimizer and metrics: the
defaults of `compute_loss`, `build_optimizer` and `build_metrics` use them
(tfdist_trainer.trainers.compiled says how).
"""

from __future__ import annotations

from typing import Any

import gin
import keras
import tensorflow as tf

from tfdist_trainer import row_gradients
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.trainers import clipping, compiled


@gin.configurable
class Trainer:
    """Base class for user trainers.

    Override `build_model`, `build_train_dataset` and `compute_loss`; usually
    also `build_optimizer`, `build_eval_dataset` and `build_metrics`. When
    `build_model` returns a compiled Keras model, `compute_loss`,
    `build_optimizer` and `build_metrics` default to what was compiled. Batches
    are `(features, labels)` or `(features, labels, sample_weight)`. Override
    `train_step` / `eval_step` only for unusual steps (GANs, several losses):
    they run once per replica inside `strategy.run`.

    Args:
      global_batch_size: examples per training step summed over all replicas
        (under parameter_server: per step of one worker). Bind it in gin as
        `Trainer.global_batch_size = 256`.
      eval_batch_size: batch size for evaluation; defaults to global_batch_size.
    """

    def __init__(self, *, global_batch_size: int = 64, eval_batch_size: int | None = None):
        if global_batch_size < 1:
            raise ConfigError(f"Trainer.global_batch_size must be >= 1, got {global_batch_size}.")
        self.global_batch_size = global_batch_size
        self.eval_batch_size = eval_batch_size or global_batch_size
        # Set by the run layer before build_model: model_dir, role, is_chief, number of workers.
        self.context: TaskContext | None = None
        # Attached by the runner (tfdist_trainer.runtime.state.build_state) under the strategy scope.
        self.model: keras.Model | None = None
        self.optimizer: keras.optimizers.Optimizer | None = None
        self.train_metrics: list[keras.metrics.Metric] = []
        self.eval_metrics: list[keras.metrics.Metric] = []
        # With gradient clipping on: the global gradient norm before clipping (a train metric).
        self.gradient_norm: keras.metrics.Metric | None = None
        # Inside train_step: the global step being taken (a scalar int64 tensor). Under
        # parameter_server, workers running at once may see the same value.
        self.step: tf.Tensor | None = None

    # -- what a user describes ----------------------------------------------
    def build_model(self) -> keras.Model:
        """Returns the Keras 3 model. Called once, under the strategy's scope."""
        raise NotImplementedError(f"{type(self).__name__} must override build_model().")

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        """Returns the optimizer: a compiled model's, else Adam. Called once, under the strategy's scope."""
        return compiled.optimizer(self.model) or keras.optimizers.Adam()

    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        """Returns this input pipeline's training data as batched `(features, labels)`.

        Batch with `self.per_replica_batch_size(input_context)` and shard with
        `tfdist_trainer.trainers.data.shard(dataset, input_context)`; repeat forever: the
        runner decides how many steps to take.
        """
        raise NotImplementedError(f"{type(self).__name__} must override build_train_dataset().")

    def build_eval_dataset(
        self, input_context: tf.distribute.InputContext
    ) -> tf.data.Dataset | None:
        """Returns finite evaluation data batched by `self.eval_batch_size`, or None for no evaluation."""
        return None

    def compute_loss(self, labels: Any, predictions: Any) -> tf.Tensor:
        """Returns the loss of each example (shape [batch]); the runner averages over the global batch.

        Not called when the model is compiled and this method is not overridden:
        the compiled loss (`model.compute_loss`) is used instead.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override compute_loss() or return a model compiled with a loss."
        )

    def build_metrics(self) -> list[keras.metrics.Metric]:
        """Returns fresh Keras metrics; called twice (train and eval sets) under the strategy's scope.

        Default: a copy of a compiled model's metrics (none for an uncompiled model).
        """
        return compiled.metrics(self)

    # -- steps (run per replica) --------------------------------------------
    def train_step(self, batch: Any) -> tf.Tensor:
        """One optimization step on this replica's batch; returns its share of the global mean loss.

        Override `compute_gradients` rather than this to keep gradient accumulation
        (`train.gradient_accumulation_steps`), which calls it once per batch and
        `apply_gradients` once per update.
        """
        loss, gradients = self.compute_gradients(batch)
        self.apply_gradients(gradients)
        return loss

    def compute_gradients(self, batch: Any) -> tuple[tf.Tensor, list]:
        """(this replica's share of the global mean loss, gradients of model.trainable_variables).

        Updates the train metrics with the batch's predictions. The gradients are of
        the loss the optimizer scales (mixed_float16); `apply_gradients` unscales them.
        Under parameter_server, sharded tables looked up together (`sharding.EmbeddingGroup`,
        `from_keras_rs`) are differentiated at the rows they read, one transfer per ps task
        (`tfdist_trainer.row_gradients`); an override with a tape of its own gets the same
        gradients, one transfer per shard.
        """
        features, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        # Sharded tables under parameter_server are differentiated at the rows they read, one
        # gradient per ps task (tfdist_trainer.row_gradients); everything else as by the tape.
        with tf.GradientTape() as tape, row_gradients.recording(tape) as rows:
            predictions = self.model(features, training=True)
            loss = self.step_loss(features, labels, predictions, sample_weight)
            # Identity unless mixed_float16 wrapped the optimizer in a LossScaleOptimizer.
            scaled_loss = self.optimizer.scale_loss(loss)
        gradients = rows.gradient(scaled_loss, self.model.trainable_variables)
        self.update_metrics(self.train_metrics, labels, predictions, sample_weight)
        return loss, gradients

    def apply_gradients(self, gradients: list) -> None:
        """One optimizer update of model.trainable_variables (the all-reduce happens here).

        Clipping (the optimizer's clipnorm, global_clipnorm or clipvalue) is computed on the
        global batch's gradients, not per replica (`trainers.clipping`).
        """
        clipping.apply_gradients(
            self.optimizer,
            gradients,
            self.model.trainable_variables,
            self.gradient_norm,
        )

    def eval_step(self, batch: Any) -> None:
        """Updates `self.eval_metrics` with one batch: the first is the mean loss, then build_metrics()."""
        features, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        predictions = self.model(features, training=False)
        loss_metric, *metrics = self.eval_metrics
        if compiled.uses_compiled_loss(self):
            share = self.step_loss(features, labels, predictions, sample_weight, training=False)
            examples = tf.shape(tf.nest.flatten(features)[0])[0]
            loss_metric.update_state(compiled.batch_mean(share), sample_weight=examples)
        else:
            per_example_loss = self.compute_loss(labels, predictions)
            if sample_weight is not None:
                per_example_loss *= tf.cast(sample_weight, per_example_loss.dtype)
            loss_metric.update_state(per_example_loss)
        self.update_metrics(metrics, labels, predictions, sample_weight)

    # -- helpers for subclasses ---------------------------------------------
    @classmethod
    @tf.autograph.experimental.do_not_convert  # a Python decision, asked while steps are traced
    def overrides(cls, name: str) -> bool:
        """Whether this subclass replaces `Trainer.<name>` (the defaults defer to a compiled model)."""
        return getattr(cls, name, None) is not getattr(Trainer, name, None)

    def per_replica_batch_size(self, input_context: tf.distribute.InputContext) -> int:
        """This replica's share of `global_batch_size`; names the problem when it does not divide."""
        replicas = input_context.num_replicas_in_sync
        if self.global_batch_size % replicas:
            raise ConfigError(
                f"Trainer.global_batch_size={self.global_batch_size} is not divisible by the "
                f"{replicas} replicas in sync; pick a multiple of {replicas}."
            )
        return self.global_batch_size // replicas

    def step_loss(
        self,
        features: Any,
        labels: Any,
        predictions: Any,
        sample_weight: Any = None,
        *,
        training: bool = True,
    ) -> tf.Tensor:
        """This replica's share of the mean loss over the global batch (regularization included).

        `average_loss(compute_loss(...))`, or a compiled model's loss when
        `compute_loss` is not overridden.
        """
        if compiled.uses_compiled_loss(self):
            return compiled.step_loss(
                self.model, features, labels, predictions, sample_weight, training
            )
        return self.average_loss(self.compute_loss(labels, predictions), sample_weight)

    def update_metrics(
        self,
        metrics: list[keras.metrics.Metric],
        labels: Any,
        predictions: Any,
        sample_weight: Any = None,
    ) -> None:
        """Updates each metric with one batch (passing `sample_weight` when the batch has one)."""
        for metric in metrics:
            if sample_weight is None:
                metric.update_state(labels, predictions)
            else:
                metric.update_state(labels, predictions, sample_weight=sample_weight)

    def average_loss(self, per_example_loss: tf.Tensor, sample_weight: Any = None) -> tf.Tensor:
        """Mean over the *global* batch plus scaled regularization losses.

        Dividing by the global batch (not the replica's) keeps gradients the same
        whatever the number of replicas, because replica gradients are summed.
        With `sample_weight`, each example's loss is weighted, still divided by
        the number of examples (Keras' "sum_over_batch_size").
        """
        per_example_loss = tf.convert_to_tensor(per_example_loss)
        if per_example_loss.shape.rank not in (None, 1):
            raise ConfigError(
                f"{type(self).__name__}.compute_loss must return one loss per example (shape [batch]), "
                f"got shape {per_example_loss.shape}."
            )
        if sample_weight is not None:
            sample_weight = tf.cast(sample_weight, tf.float32)
        loss = tf.nn.compute_average_loss(
            tf.cast(per_example_loss, tf.float32), sample_weight=sample_weight
        )
        if self.model is not None and self.model.losses:
            loss += tf.nn.scale_regularization_loss(
                tf.add_n([tf.cast(reg, tf.float32) for reg in self.model.losses])
            )
        return loss
