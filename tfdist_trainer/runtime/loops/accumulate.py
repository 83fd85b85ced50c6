"""Gradient accumulation owned by the trainer (`train.gradient_accumulation_steps = k`).

One step (one optimizer update, one global step) takes k consecutive batches of each
replica: their gradients are summed in the step and applied once, divided by k, so
the update is that of one batch k times larger (each batch's loss is already a share
of the mean over the global batch). The all-reduce happens once per update, in
`apply_gradients`, under every strategy; under parameter_server a scheduled closure
holds whole updates. Keras' own `gradient_accumulation_steps` puts the update inside
a `tf.cond`, where `merge_call` fails under multi_worker_mirrored and parameter_server
(docs/design.md), so this one is built in the step instead, unrolled over the k batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist_trainer.row_gradients import add


def _divide(gradient: Any, k: int) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / k, gradient.indices, gradient.dense_shape)
    return gradient / tf.cast(k, gradient.dtype)


def accumulating_step(
    gradients_of: Callable[[Any], tuple[Any, Sequence]],
    apply_gradients: Callable[[list], None],
    k: int,
) -> Callable[[Sequence[Any]], Any]:
    """A replica step over `k` batches: k gradient passes, one update; returns the mean loss."""

    def step(batches: Sequence[Any]):
        total_loss, summed = None, None
        for batch in batches:
            loss, gradients = gradients_of(batch)
            total_loss = loss if total_loss is None else total_loss + loss
            summed = (
                list(gradients)
                if summed is None
                else [add(a, b) for a, b in zip(summed, gradients)]
            )
        apply_gradients([_divide(g, k) for g in summed])
        return total_loss / k

    return step
