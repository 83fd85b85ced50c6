"""The training state of one task: the user's model, optimizer and metrics, built under the strategy.

Everything is created here, under the strategy's scope, never lazily inside
a step: variables land where the scope (or a model_parallel plan) puts them
only when they are created outside a `tf.function`.
"""

from __future__ import annotations

import hashlib

import keras
import tensorflow as tf
from absl import logging

from tfdist_trainer import sharding, tf_compat
from tfdist_trainer.runtime.strategy_runtime import StrategyRuntime
from tfdist_trainer.trainers import compiled
from tfdist_trainer.trainers.trainer import Trainer


def build_model(trainer: Trainer, runtime: StrategyRuntime | None = None) -> keras.Model:
    """Builds the user's model with all its variables, never lazily inside a step.

    Variables land where the current scope (or a model_parallel plan) places
    them only when they are created here, not when a `tf.function` first
    calls the model.
    """
    model = trainer.build_model()
    if runtime is not None:
        model = runtime.prepare_model(model)
    if not model.built or (runtime is not None and runtime.calls_model_once):
        features, _, _ = compiled.example_batch(trainer)  # zeros shaped like one example
        model(features, training=False)
    if runtime is not None:
        runtime.model_built(model)
    return model


def build_state(
    trainer: Trainer,
    strategy: tf.distribute.Strategy,
    *,
    with_optimizer: bool = True,
    runtime: StrategyRuntime | None = None,
) -> tuple[tf.Variable, tf.train.Checkpoint]:
    """Creates model, optimizer, metrics and global step under the scope; returns (global_step, checkpoint)."""
    with strategy.scope(), sharding.record_all_variables():
        # The placement scope lets self-sharding layers balance bytes against every variable.
        trainer.model = build_model(trainer, runtime)
        compiled.prepare(trainer)  # a compiled model's loss state, before any step
        trainer.train_metrics = trainer.build_metrics()
        trainer.eval_metrics = [keras.metrics.Mean(name="loss")] + trainer.build_metrics()
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            tf_compat.make_metric_updates_atomic(trainer.train_metrics + trainer.eval_metrics)
        global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        items = {"model": trainer.model, "global_step": global_step}
        if with_optimizer:
            trainer.optimizer = trainer.build_optimizer()
            if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
                trainer.optimizer, keras.optimizers.LossScaleOptimizer
            ):
                # float16 gradients underflow without loss scaling; Trainer.train_step scales the loss.
                trainer.optimizer = keras.optimizers.LossScaleOptimizer(trainer.optimizer)
            trainer.optimizer.build(trainer.model.trainable_variables)
            items["optimizer"] = trainer.optimizer
        if runtime is not None:
            runtime.state_built(trainer)
    return global_step, tf.train.Checkpoint(**items)


def log_placement(trainer: Trainer) -> None:
    """Where every variable lives (variable, shape, bytes, device; bytes per device), once, on the chief."""
    variables = list(trainer.model.variables) + (
        list(trainer.optimizer.variables) if trainer.optimizer else []
    )
    logging.info("variable placement:\n%s", sharding.placement_table(variables))


#: Above this many parameters the fingerprint is skipped: it would pull every table to this task.
FINGERPRINT_MAX_PARAMS = 50_000_000


def weights_fingerprint(model: keras.Model) -> str:
    """A short hash of this task's copy of the weights: synchronous workers must agree on it."""
    if model.count_params() > FINGERPRINT_MAX_PARAMS:
        return f"skipped ({model.count_params():,} parameters)"
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()[:16]
