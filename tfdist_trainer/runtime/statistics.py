"""Statistics every replica must agree on: BatchNormalization's moving mean and variance.

Keras updates a BatchNormalization layer's moving statistics from each replica's own
batches and nothing averages them, so under mirrored and multi_worker_mirrored the
replicas end with identical trainable weights but different statistics (measured on a
keras-hub ResNet and the zoo's: all 12 moving means and variances differed between 2
workers), and a checkpoint keeps one replica's. `StatisticsSync` averages them over
every replica after each loop call (one small all-reduce, every task at the same point),
so checkpoints, evaluations and exports, which all happen between loops, see the mean.
`agree_on_weights` checks the claim at the end: the chief says whether the workers'
weights (statistics included) are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat


def statistic_variables(model: Any) -> list:
    """The non-trainable float variables of the model's BatchNormalization layers."""
    found = []
    for layer in tf_compat.sublayers(model, include_self=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            found.extend(v for v in layer.non_trainable_variables if v.dtype.startswith("float"))
    return found


class StatisticsSync:
    """Averages the model's statistics over every replica in sync; a no-op where there is one."""

    def __init__(self, strategy: tf.distribute.Strategy, model: Any):
        self.variables = statistic_variables(model)
        self.enabled = bool(self.variables) and strategy.num_replicas_in_sync > 1
        if not self.enabled:
            return
        variables = self.variables

        @tf.function
        def average():
            local = strategy.run(lambda: [tf.identity(v.value) for v in variables])
            for variable, value in zip(variables, local):
                variable.assign(strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None))

        self._average = average

    def __call__(self) -> None:
        if self.enabled:
            self._average()


def agree_on_weights(
    fingerprint: str, max_over_workers: Callable[[int], int] | None, *, is_chief: bool
) -> None:
    """Synchronous workers compare their weights' fingerprints; the chief says whether they agree."""
    if max_over_workers is None or not fingerprint[:1].isalnum() or " " in fingerprint:
        return
    value = int(fingerprint[:15], 16)
    highest, lowest = max_over_workers(value), -max_over_workers(-value)
    if not is_chief:
        return
    if highest == lowest:
        logging.info("every worker holds the same weights (fingerprint %s)", fingerprint)
    else:
        logging.warning(
            "the workers' weights differ at the end (fingerprints from %015x to %015x): a "
            "variable was updated per worker and never averaged; the checkpoint holds the chief's",
            lowest,
            highest,
        )
