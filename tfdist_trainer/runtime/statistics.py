"""Statistics every replica must agree on: BatchNormalization's moving mean and variance.

Keras updates a BatchNormalization layer's moving statistics from each replica's own
batches and nothing averages them, so under mirrored and multi_worker_mirrored the
replicas end with identical trainable weights but different statistics (measured on a
keras-hub ResNet and the zoo's: all 12 moving means and variances differed between 2
workers), and a checkpoint keeps one replica's. `StatisticsSync` averages them over
every replica after each loop call (one small all-reduce, every task at the same point),
so checkpoints, evaluations and exports, which all happen between loops, see the mean.
`agree_on_weights` checks the claim at the end: each task says whether its own
replicas (mirrored's devices) hold the same values, and the chief whether the
workers' weights (statistics included) are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.runtime.state import FINGERPRINT_MAX_PARAMS
from tfdist_trainer.runtime.strategies import StrategyRuntime


def statistic_variables(model: Any) -> list:
    """The non-trainable float variables of the model's BatchNormalization layers."""
    found = []
    for layer in tf_compat.sublayers(model, include_self=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            found.extend(v for v in layer.non_trainable_variables if v.dtype.startswith("float"))
    return found


class StatisticsSync:
    """Averages the model's statistics over every replica in sync; a no-op for a model without
    any, or where the strategy says there is nothing to average
    (`StrategyRuntime.averages_statistics`: one replica in sync)."""

    def __init__(self, runtime: StrategyRuntime, model: Any):
        self.variables = statistic_variables(model)
        self.enabled = bool(self.variables) and runtime.averages_statistics
        if not self.enabled:
            return
        variables, strategy = self.variables, runtime.strategy

        @tf.function
        def average():
            local = strategy.run(lambda: [tf.identity(v.value) for v in variables])
            for variable, value in zip(variables, local):
                variable.assign(strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None))

        self._average = average

    def __call__(self) -> None:
        if self.enabled:
            self._average()


def replica_copies_that_differ(model: Any) -> tuple[int, list[str]]:
    """(replicas on this task, paths of the variables whose per-replica copies differ)."""
    replicas, differ = 1, []
    if model.count_params() > FINGERPRINT_MAX_PARAMS:  # each copy would come to this host's memory
        return replicas, differ
    for variable in model.weights:
        value = getattr(variable, "value", variable)
        if not isinstance(value, tf.distribute.DistributedValues):
            continue
        copies = [c.numpy() for c in value.values]
        replicas = max(replicas, len(copies))
        if any(not np.array_equal(copies[0], c) for c in copies[1:]):
            differ.append(variable.path)
    return replicas, differ


def agree_on_weights(
    model: Any,
    fingerprint: str,
    max_over_workers: Callable[[int], int] | None,
    *,
    is_chief: bool,
) -> None:
    """Replicas on this task, then synchronous workers, must hold the same weights; says whether."""
    replicas, differ = replica_copies_that_differ(model)
    if differ:
        logging.warning(
            "this task's %d replicas hold different values of %d variable(s) (%s): a variable "
            "was updated per replica and never averaged; the checkpoint holds the first one's",
            replicas,
            len(differ),
            ", ".join(differ[:3]) + (", ..." if len(differ) > 3 else ""),
        )
    elif replicas > 1:
        logging.info("every replica on this task holds the same weights (%d replicas)", replicas)
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
