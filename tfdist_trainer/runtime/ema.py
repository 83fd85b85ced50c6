"""The optimizer's moving averages (`use_ema=True`) where users expect them: evaluations and exports.

Keras keeps the averages in the optimizer and only `fit` swaps them into the model, at
its very end (`finalize_variable_values`). Training here goes on with the raw weights,
so evaluation (inline and the evaluator side-car), `ExportSavedModel`, `BestExporter`
and `--mode=evaluate/export` swap the averages in for their duration and the raw
weights back after; checkpoints hold both (the raw weights, and the averages as
optimizer variables), so a resumed run goes on exactly where it stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat


def base_optimizer(optimizer: Any) -> Any:
    """The optimizer that keeps the averages (a LossScaleOptimizer's inner one)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def uses_ema(optimizer: Any) -> bool:
    return optimizer is not None and bool(getattr(base_optimizer(optimizer), "use_ema", False))


def averages_of(trainer: Any) -> list:
    """[(model variable, its average)] of the trainer's optimizer; [] without EMA."""
    if not uses_ema(trainer.optimizer):
        return []
    pairs = zip(
        trainer.model.trainable_variables,
        tf_compat.moving_averages(base_optimizer(trainer.optimizer)),
    )
    return [(v, a) for v, a in pairs if a is not None]


@contextlib.contextmanager
def averaged_weights(trainer: Any) -> Iterator[bool]:
    """Inside, the model holds the optimizer's averages (yields whether it does); outside, the raw weights."""
    pairs = averages_of(trainer)
    if not pairs:
        yield False
        return
    raw = [tf.identity(v.value if hasattr(v, "value") else v) for v, _ in pairs]
    for variable, average in pairs:
        variable.assign(average)
    try:
        yield True
    finally:
        for (variable, _), value in zip(pairs, raw):
            variable.assign(value)


def checkpoint_for_reading(trainer: Any, global_step: Any = None) -> tf.train.Checkpoint:
    """What a task that reads checkpoints without training restores (the side-car, --mode): the
    model and the step, and the optimizer too when it keeps averages (so they are restored)."""
    items = {"model": trainer.model}
    if global_step is not None:
        items["global_step"] = global_step
    optimizer = trainer.build_optimizer()
    if uses_ema(optimizer):
        optimizer.build(trainer.model.trainable_variables)
        trainer.optimizer = items["optimizer"] = optimizer
    return tf.train.Checkpoint(**items)
