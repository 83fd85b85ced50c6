"""parameter_server at run time: `ParameterServerStrategy` and the chief's `ClusterCoordinator`.

The TensorFlow half of `plan/strategies/parameter_server.py`, and the home of the machinery
only this strategy uses, so that a reader of one strategy finds all of it in one place:

  scheduled_loop  the chief's step loop, whole loops scheduled onto the workers
  watchdog        the stall deadline: a cluster whose closures stopped finishing ends in an error
  data_service    the training data read once per epoch through the tf.data service
  stall           a stalled cluster's last words: save what the finished loops counted, then exit
  serve           what the ps, worker and dispatcher tasks run: serve until training is done

The coordinator is what makes this strategy different at run time: `StrategyRuntime.schedules`
and `spans_tasks` are true when there is one, so the chief schedules its loops onto the workers
(`step_loop`) and its checkpoints hold the ps tasks' variables. The chief also evaluates
locally (`eval_loop`), makes metric updates atomic (`metrics_built`), answers a preempted ps's
save request (`answers_ps_save_requests`) and ends the task when its workers stall (`run_loop`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ClusterStalledError
from tfdist_trainer.plan.cluster import WORKER, ClusterConfig
from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import loops
from tfdist_trainer.runtime.checkpoints import FinalSave
from tfdist_trainer.runtime.strategies.base import StrategyRuntime
from tfdist_trainer.runtime.strategies.parameter_server import stall
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

    @classmethod
    def serve(cls, cluster: ClusterConfig, model_dir: str, **grace_s: float) -> None:
        """The ps, worker and dispatcher tasks serve until the chief marks training done (`serve`)."""
        from tfdist_trainer.runtime.strategies.parameter_server import serve as serving

        serving.serve(cluster, model_dir, **grace_s)

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

    def eval_loop(self, trainer: Any) -> loops.EvalLoop:
        """The chief evaluates in its own process, reading the variables from the ps tasks."""
        return loops.EvalLoop(trainer, self.strategy, distributed=not self.schedules)

    def metrics_built(self, metrics: list) -> None:
        """Workers update the metrics concurrently: each update is made atomic."""
        tf_compat.make_metric_updates_atomic(metrics)

    def state_built(self, trainer: Any) -> None:
        """Each update reads the learning rate once for all the variables, each on its own ps
        (Keras reads it once per variable: one transfer each), and counts its step atomically
        (workers apply concurrently)."""
        if getattr(trainer, "optimizer", None) is not None:
            tf_compat.read_learning_rate_once(trainer.optimizer)
            tf_compat.make_optimizer_steps_atomic(trainer.optimizer)

    def answers_ps_save_requests(self, cluster: ClusterConfig) -> bool:
        """The chief saves the variables a preempted ps holds before that ps exits."""
        return self.schedules and cluster.is_chief

    def run_loop(
        self, loop: Any, steps: int, *, stop: Callable[[], bool], final_save: FinalSave
    ) -> Any:
        """A cluster whose workers stopped answering (the watchdog, `stall_timeout_s`) saves what
        the finished closures counted, when it can, and ends the task (`stall`)."""
        try:
            return loop.train(steps, stop=stop)
        except ClusterStalledError as stalled:
            raise stall.stalled_error(final_save, stalled, self.config.stall_timeout_s) from None
