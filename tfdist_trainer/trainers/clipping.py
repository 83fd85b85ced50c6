"""Gradient clipping over the global batch, under every strategy.

Keras clips (`clipnorm`, `global_clipnorm`, `clipvalue`) inside `apply_gradients`,
which a tf.distribute strategy runs per replica before it sums the replicas'
gradients: each replica clips its own share, so a clipped step under mirrored or
multi_worker_mirrored differs from the same global batch on one device (measured:
weights 0.009 apart after 2 steps, global_clipnorm 0.05). Where a step has several
replicas in sync and the optimizer clips, the gradients are all-reduced first, clipped
with the optimizer's own rule, and each replica applies its 1/N share with the
optimizer's clipping off (the optimizer sums the shares back). One extra all-reduce
per step, only when clipping is on. Under parameter_server each worker updates on
its own batch (one replica in sync): nothing changes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

#: The Keras optimizer settings that clip gradients, in the order Keras applies the first set.
CLIP_SETTINGS = ("clipnorm", "global_clipnorm", "clipvalue")


def clips(optimizer: Any) -> bool:
    return any(getattr(optimizer, name, None) for name in CLIP_SETTINGS)


class _ClippingOff:
    """Turns the optimizer's own clipping off while the replicas apply, and back on after.

    MirroredStrategy runs the replicas in threads that share the optimizer and meet
    inside `apply_gradients` (merge_call): the first to enter saves the settings and
    clears them, the last to leave restores them, and every replica reads the saved
    settings, never the cleared ones.
    """

    _lock = threading.Lock()
    _active: dict[int, tuple[int, dict[str, Any]]] = {}

    def __init__(self, optimizer: Any):
        self.optimizer = optimizer

    def __enter__(self) -> dict[str, Any]:
        key = id(self.optimizer)
        with self._lock:
            count, saved = self._active.get(key, (0, None))
            if saved is None:
                saved = {name: getattr(self.optimizer, name) for name in CLIP_SETTINGS}
                for name in CLIP_SETTINGS:
                    setattr(self.optimizer, name, None)
            self._active[key] = (count + 1, saved)
            return saved

    def __exit__(self, *exc) -> None:
        key = id(self.optimizer)
        with self._lock:
            count, saved = self._active[key]
            if count == 1:
                del self._active[key]
                for name, value in saved.items():
                    setattr(self.optimizer, name, value)
            else:
                self._active[key] = (count - 1, saved)


def _clip(settings: dict[str, Any], gradients: list) -> list:
    """Keras' rule (BaseOptimizer._clip_gradients): the first setting given wins."""
    if settings["clipnorm"]:
        return [tf.clip_by_norm(g, settings["clipnorm"]) for g in gradients]
    if settings["global_clipnorm"]:
        return tf.clip_by_global_norm(gradients, settings["global_clipnorm"])[0]
    value = settings["clipvalue"]
    return [tf.clip_by_value(g, -value, value) for g in gradients]


def gradient_norm_metric(optimizer: Any) -> keras.metrics.Metric | None:
    """Where clipping is on, the global gradient norm before clipping is worth a progress column:
    a `gradient_norm` mean over the steps since the last record (created under the strategy)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or not clips(optimizer):
        return None
    return keras.metrics.Mean(name="gradient_norm")


def apply_gradients(
    optimizer: Any,
    gradients: Sequence[Any],
    variables: Sequence[Any],
    norm_metric: keras.metrics.Metric | None = None,
) -> None:
    """`optimizer.apply_gradients`, with clipping computed on the global batch's gradients.

    `norm_metric` (from `gradient_norm_metric`) takes the global norm before clipping.
    """
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync if context is not None else 1
    # A LossScaleOptimizer's gradients are scaled until it unscales them: leave it to Keras.
    if (
        replicas == 1
        or isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        or not (clips(optimizer) or id(optimizer) in _ClippingOff._active)
    ):
        if norm_metric is not None:
            norm_metric.update_state(tf.linalg.global_norm([g for g in gradients if g is not None]))
        optimizer.apply_gradients(zip(gradients, variables))
        return
    pairs = [(g, v) for g, v in zip(gradients, variables) if g is not None]
    summed = context.all_reduce(
        tf.distribute.ReduceOp.SUM, [tf.convert_to_tensor(g) for g, _ in pairs]
    )
    if norm_metric is not None:
        norm_metric.update_state(tf.linalg.global_norm(summed))
    with _ClippingOff(optimizer) as settings:
        clipped = _clip(settings, list(summed))
        optimizer.apply_gradients(zip([g / replicas for g in clipped], [v for _, v in pairs]))
