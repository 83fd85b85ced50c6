"""parameter_server at run time: `ParameterServerStrategy` and the chief's `ClusterCoordinator`.

The TensorFlow half of `plan/strategies/parameter_server.py`, and the home of the machinery
only this strategy uses, so that a reader of one strategy finds all of it in one place:

  scheduled_loop  the chief's step loop, whole loops scheduled onto the workers
  watchdog        the stall deadline: a cluster whose closures stopped finishing ends in an error
  data_service    the training data read once per epoch through the tf.data service
  serve           what the ps, worker and dispatcher tasks run: serve until training is done

The coordinator is what makes this strategy different at run time: `StrategyRuntime.schedules`
and `spans_tasks` are true when there is one, so the chief schedules its loops onto the workers
(`step_loop`) and its checkpoints hold the ps tasks' variables.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.plan.cluster import WORKER, ClusterConfig
from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime
from tfdist_trainer.runtime.strategies.parameter_server.scheduled_loop import ScheduledTrainLoop


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

    def step_loop(
        self,
        trainer: Any,
        global_step: tf.Variable,
        steps_per_loop: Any,
        cluster: ClusterConfig,
        **common: Any,
    ) -> Any:
        """The chief's `ScheduledTrainLoop`: whole step loops handed to the workers by the
        coordinator, with the stall deadline and, when asked, the tf.data service."""
        if not self.schedules:
            return super().step_loop(trainer, global_step, steps_per_loop, cluster, **common)
        return ScheduledTrainLoop(
            self.strategy,
            self.coordinator,
            trainer,
            global_step,
            steps_per_loop,
            **common,
            num_workers=cluster.num_tasks(WORKER),
            stall_timeout_s=self.config.stall_timeout_s,
            worker_addresses=[t.address for t in cluster.tasks((WORKER,))],
            dispatcher_address=cluster.dispatcher_address,
        )
