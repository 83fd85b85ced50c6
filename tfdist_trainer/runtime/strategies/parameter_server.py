"""parameter_server at run time: `ParameterServerStrategy` and the chief's `ClusterCoordinator`.

The TensorFlow half of `plan/strategies/parameter_server.py`. The coordinator is what makes
this strategy different at run time: `StrategyRuntime.schedules` and `spans_tasks` are true
when there is one, so the chief schedules its loops onto the workers
(`loops.ScheduledTrainLoop`) and its checkpoints hold the ps tasks' variables.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime


class ParameterServerRuntime(StrategyRuntime):
    """parameter_server on the chief: variables on the ps tasks, step loops scheduled onto workers."""

    config: ParameterServer

    @classmethod
    def start(
        cls, config: ParameterServer, *, context: TaskContext | None = None
    ) -> ParameterServerRuntime:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        return cls(config, strategy, coordinator=coordinator, context=context)
