"""What a Trainer takes from a compiled Keras model: its loss, optimizer and metrics.

When `Trainer.build_model` returns a model on which `model.compile(optimizer=...,
loss=..., metrics=[...], loss_weights=...)` was called, the Trainer's defaults
use what was compiled, unless the subclass overrides the matching method:

- loss: `model.compute_loss(x, y, y_pred, sample_weight)` (per-output losses,
  `loss_weights`, regularization, a `compute_loss` override on the model).
  Keras divides a replica's mean by the replicas in sync, so the summed
  replica gradients are those of the mean over the global batch, as with
  `Trainer.average_loss` (unless `Trainer.compute_loss` is overridden);
- optimizer: `model.optimizer` (unless `Trainer.build_optimizer` is overridden);
- metrics: a fresh copy of the compiled metrics for training and another for
  evaluation (unless `Trainer.build_metrics` is overridden).

Keras' own step methods (`Model.train_step`, `test_step`, `compute_metrics`)
belong to `model.fit`'s loop and are not called here: a model that overrides
them is refused with a sentence naming what to override instead.
Private Keras pieces are reached only through `tfdist_trainer.tf_compat`.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.trainers import data as data_lib


class ModelOwner(Protocol):
    """What this module reads of a Trainer: its model, its training data, and which of its
    methods the user overrode. A protocol, not the `Trainer` class: trainer.py imports this
    module, and an import back would be a cycle."""

    model: Any

    def overrides(self, name: str) -> bool: ...

    def build_train_dataset(self, context: Any) -> Any: ...


def is_compiled(model: Any) -> bool:
    """Whether `model.compile(...)` was called on `model`."""
    return isinstance(model, keras.Model) and bool(getattr(model, "compiled", False))


def _overrides(obj: Any, base: type, name: str) -> bool:
    return getattr(type(obj), name, None) is not getattr(base, name, None)


@tf.autograph.experimental.do_not_convert
def uses_compiled_loss(trainer: ModelOwner) -> bool:
    """Whether the step loss comes from the model's compile (Trainer.compute_loss not overridden).

    A Python decision, taken while a step is traced: nothing for AutoGraph to convert. One
    loaded test run failed inside AutoGraph's conversion of it and of `Trainer.overrides`
    ("type object 'GPT2LMTrainer' has no attribute 'model'", from the class's `eval_step`);
    it did not recur in isolation.
    """
    return not trainer.overrides("compute_loss") and is_compiled(trainer.model)


def example_batch(trainer: ModelOwner) -> tuple[Any, Any, Any]:
    """(features, labels, sample_weight) of one example, zeros, shaped like the training data.

    The one zero-batch builder: it builds a lazy model (runtime.state) and a compiled
    loss's state (below). The dataset's element_spec is read once per Trainer.
    """
    if getattr(trainer, "_example_spec", None) is None:
        spec = trainer.build_train_dataset(data_lib.single_pipeline_context()).element_spec
        trainer._example_spec = spec  # noqa: SLF001  (built once per Trainer)
    spec = trainer._example_spec  # noqa: SLF001

    def zeros(s):
        if s is None:
            return None
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros([1] + shape[1:], s.dtype)

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(spec)
    return tuple(tf.nest.map_structure(zeros, part) for part in (x, y, sample_weight))


def prepare(trainer: ModelOwner) -> None:
    """Checks a compiled model against its Trainer and creates the compiled loss's state.

    Called by the run layer under the strategy's scope, once `trainer.model` is
    built: Keras would otherwise create the loss trackers of a multi-output
    model inside the first step.
    """
    model = trainer.model
    if not is_compiled(model):
        return
    name = type(trainer).__name__
    for model_method, trainer_method in (
        ("train_step", "train_step"),
        ("test_step", "eval_step"),
        ("compute_metrics", "build_metrics"),
    ):
        if _overrides(model, keras.Model, model_method) and not trainer.overrides(trainer_method):
            raise ConfigError(
                f"{type(model).__name__} overrides keras.Model.{model_method}, which only model.fit calls; "
                f"move its body into {name}.{trainer_method} (it runs once per replica the same way), "
                f"or override {type(model).__name__}.compute_loss, which is used."
            )
    if not uses_compiled_loss(trainer):
        return
    if tf_compat.compiled_loss(model) is None and not _overrides(
        model, keras.Model, "compute_loss"
    ):
        raise ConfigError(
            f"{name}.build_model returned a model compiled without a loss; pass loss=... to "
            f"model.compile() or override {name}.compute_loss."
        )
    features, labels, _ = example_batch(trainer)
    tf_compat.build_compiled_loss(model, labels, model(features, training=False))


def optimizer(model: Any) -> keras.optimizers.Optimizer | None:
    """The compiled optimizer, checked to have been created under the current strategy's scope."""
    if not is_compiled(model) or getattr(model, "optimizer", None) is None:
        return None
    compiled_optimizer = model.optimizer
    if tf.distribute.has_strategy():
        iterations = tf_compat.variable_storage(compiled_optimizer.iterations)
        if not tf.distribute.get_strategy().extended.variable_created_in_scope(iterations):
            raise ConfigError(
                f"the optimizer {compiled_optimizer.name!r} given to model.compile() was created outside the "
                f"strategy's scope, so its variables are not distributed; create it where the model is "
                f"built (in build_model or KerasTrainer.model_fn), e.g. model.compile(optimizer='adam'), "
                f"not at import time."
            )
    return compiled_optimizer


def metrics(trainer: ModelOwner) -> list[keras.metrics.Metric]:
    """A new copy of the compiled metrics ([] without any), built under the current scope."""
    if not is_compiled(trainer.model):
        return []
    features, labels, _ = example_batch(trainer)
    copy = tf_compat.compiled_metrics(
        trainer.model, labels, trainer.model(features, training=False)
    )
    return [copy] if copy is not None and copy.metrics else []


def step_loss(
    model: keras.Model,
    features: Any,
    labels: Any,
    predictions: Any,
    sample_weight: Any,
    training: bool,
) -> tf.Tensor:
    """`model.compute_loss`: this replica's share of the global batch's mean loss (Keras scales it)."""
    kwargs = {}
    if "training" in inspect.signature(model.compute_loss).parameters:
        kwargs["training"] = training
    loss = model.compute_loss(
        x=features, y=labels, y_pred=predictions, sample_weight=sample_weight, **kwargs
    )
    return tf.cast(loss, tf.float32)


def batch_mean(share: tf.Tensor) -> tf.Tensor:
    """The mean over this replica's batch of a loss Keras scaled by 1 / replicas in sync."""
    return share * tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, share.dtype)
