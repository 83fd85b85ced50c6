"""Builds one training task: strategy, state, restore, loop, run context and hooks (`build_run`).

What `run_training` drives, what `tfdist_trainer.train(...)` runs, and what the
benchmarks time: one path, so a benchmark measures what a user runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import keras
from absl import logging

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.hooks import Hook
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.runtime import apply_warm_start, checkpoints, loops, statistics, strategies
from tfdist_trainer.runtime.state import build_state, log_placement
from tfdist_trainer.runtime.strategies import StrategyRuntime
from tfdist_trainer.runtime.train import task_hooks
from tfdist_trainer.runtime.train.run_context import RunContext
from tfdist_trainer.sharding import runtime_api as tables


@dataclasses.dataclass
class Run:
    """One training task, built and restored: call `train(steps)` between hook calls.

    Attributes:
      context: what hooks may touch (`RunContext`).
      loop: the strategy's step loop (`loops.TrainLoop`, or parameter_server's `ScheduledTrainLoop`: `StrategyRuntime.step_loop`).
      runtime: the strategy at run time.
      hooks: the user's hooks (gin's defaults and extra_hooks), then the task's own (`task_hooks`).
      stop: asked by the loop between its calls: true once a hook must act before the next
        hook stop (a SIGTERM: `task_hooks.between_loops`).
    """

    context: RunContext
    loop: Any
    runtime: StrategyRuntime
    hooks: list[Hook]
    sync_statistics: Callable[[], None] = lambda: None
    stop: Callable[[], bool] = loops.never

    def train(self, steps: int) -> loops.LoopResult:
        """Runs `steps` steps (fewer once `stop` says so; what a stalled cluster does is the
        strategy's `run_loop`), then averages the replicas' statistics (BatchNormalization's)
        before any hook saves, evaluates or exports."""
        result = self.runtime.run_loop(
            self.loop, steps, stop=self.stop, final_save=self.context.final_save()
        )
        self.sync_statistics()
        return result


def start_runtime(
    experiment: Experiment, cluster: ClusterConfig, model_dir: str
) -> StrategyRuntime:
    """Seeds, configures devices, starts the strategy, sets the mixed-precision policy; one
    sentence when TF was started too early."""
    config, options = experiment.strategy_config, experiment.loop
    if options.seed is not None:
        keras.utils.set_random_seed(options.seed)
    try:
        strategies.prepare_devices(config)
        runtime = strategies.start(config, context=config.task_context(cluster, model_dir))
    # "cannot be modified after being initialized", "must be configured at startup"
    except RuntimeError as e:
        raise ConfigError(
            f"TensorFlow was already running when the {config.name} strategy was set up ({str(e).strip()}); "
            f"a module imported by the gin config probably runs TensorFlow ops at import time: move them "
            f"into the Trainer's methods."
        ) from None
    runtime.check_jit_compile(options.jit_compile)
    if options.mixed_precision:
        keras.mixed_precision.set_global_policy(options.mixed_precision)
    logging.info(
        "strategy %s with %d replica(s) in sync", config.name, runtime.strategy.num_replicas_in_sync
    )
    return runtime


def _restored_state(
    experiment: Experiment,
    cluster: ClusterConfig,
    model_dir: str,
    runtime: StrategyRuntime,
    trainer: Any,
) -> tuple[Any, Any]:
    """(global step, checkpointer): the trainer's state built under the strategy's scope and
    restored from model_dir's newest checkpoint, or warm-started in a fresh model_dir."""
    # Resuming: the tables start as zeros, not random rows that the restore overwrites next.
    with tables.restore_follows(checkpoints.resumes(model_dir)):
        global_step, checkpoint = build_state(trainer, runtime.strategy, runtime=runtime)
    checkpointer = runtime.checkpointer(
        experiment.checkpoints,
        model_dir=model_dir,
        cluster=cluster,
        checkpoint=checkpoint,
        global_step=global_step,
    )
    apply_warm_start.warm_start_or_resume(
        experiment.warm_start,
        trainer,
        restored_step=checkpointer.restore(),
        model_dir=model_dir,
        is_chief=cluster.is_chief,
        scope=runtime.strategy.scope,
    )
    return global_step, checkpointer


def build_run(experiment: Experiment, cluster: ClusterConfig, model_dir: str) -> Run:
    """The training task of `cluster` for `experiment`, restored from model_dir (or warm-started)."""
    runtime = start_runtime(experiment, cluster, model_dir)
    trainer = experiment.trainer_cls()
    trainer.context = runtime.context
    global_step, checkpointer = _restored_state(experiment, cluster, model_dir, runtime, trainer)
    if cluster.is_chief:
        log_placement(trainer, experiment.logging.whole_table_warning_bytes)
    max_over_workers = runtime.max_over_workers(cluster)
    loop = runtime.make_train_loop(
        trainer,
        global_step,
        experiment.loop,
        cluster,
        agree=max_over_workers,
        whole_table_warning_bytes=experiment.logging.whole_table_warning_bytes,
    )
    context = RunContext(
        experiment=experiment,
        cluster=cluster,
        model_dir=model_dir,
        strategy=runtime.strategy,
        trainer=trainer,
        global_step=global_step,
        checkpointer=checkpointer,
        evaluator=runtime.eval_loop(trainer),
        max_over_workers=max_over_workers,
    )
    own_hooks = task_hooks.task_hooks(context, answers_ps=runtime.answers_ps_save_requests(cluster))
    return Run(
        context=context,
        loop=loop,
        runtime=runtime,
        hooks=[*experiment.hooks, *own_hooks],
        sync_statistics=statistics.StatisticsSync(runtime, trainer.model),
        stop=task_hooks.between_loops(context, own_hooks),
    )
