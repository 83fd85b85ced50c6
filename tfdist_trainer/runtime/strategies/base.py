"""What every strategy's runtime shares: `StrategyRuntime`, the base of each `<Name>Runtime`.

A strategy at run time is one class in `runtime/strategies/<name>.py`, the TensorFlow half of
`plan/strategies/<name>.py`. Its two class methods build it, in two steps because devices
must be configured before TensorFlow's runtime starts and the strategy only after:
`prepare_devices(config)` (logical CPUs, GPU memory growth; most strategies need none) and
`start(config, context=...)` (the `tf.distribute.Strategy` and what it needs, TF_CONFIG
already in the environment). The instance then answers every question that depends on the
strategy, as a one-line question or one method: which loop runs the steps
(`make_train_loop`, `run_loop`: what a stalled cluster does), which evaluation pass
(`eval_loop`), how synchronous workers agree (`max_over_workers`, `averages_statistics`),
whether a checkpoint spans tasks (`spans_tasks`) and which task keeps it
(`keeps_checkpoints`), whether metric updates must be atomic (`metrics_built`), whether a
preempted ps's save request is answered (`answers_ps_save_requests`), how the job ends
(`finish_job`), whether XLA can compile the step (`check_jit_compile`). Nothing outside
`runtime/strategies/` asks which `tf.distribute` strategy runs. The defaults here are a synchronous strategy's; a runtime overrides
what differs (model_parallel places the model and builds its own step).

`start` builds one runtime holding everything it needs (the strategy, the coordinator, the
task's context, model_parallel's devices), so nothing depends on having called another
method first, except that a model must be prepared before its step is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.plan.options import CheckpointOptions, LoopOptions
from tfdist_trainer.plan.strategies import StrategyConfig
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import loops, shutdown, whole_tables
from tfdist_trainer.runtime.checkpoints import Checkpointer, FinalSave
from tfdist_trainer.runtime.loops import accumulate
from tfdist_trainer.sharding import runtime_api as tables


def available_gpus() -> list:
    """This process's physical GPUs: the strategies that use GPUs when there are any ask it."""
    return tf.config.list_physical_devices("GPU")


class StrategyRuntime:
    """One task's strategy, built by `start`, and what the state and the loops need from it.

    Attributes:
      config: the gin strategy (settings and topology).
      strategy: the `tf.distribute.Strategy`.
      coordinator: a `ClusterCoordinator` where the chief schedules work (parameter_server); else None.
      context: the task (model_dir, role...); None for a library user outside a run.
    """

    def __init__(
        self,
        config: StrategyConfig,
        strategy: tf.distribute.Strategy,
        *,
        coordinator: Any = None,
        context: TaskContext | None = None,
    ):
        self.config = config
        self.strategy = strategy
        self.coordinator = coordinator
        self.context = context

    # -- building it: one pair of class methods a strategy --------------------------------

    @classmethod
    def prepare_devices(cls, config: StrategyConfig) -> None:
        """Device set-up that must happen before the TF runtime starts (mirrored's logical CPUs,
        model_parallel's devices); most strategies need none."""

    @classmethod
    def start(
        cls, config: StrategyConfig, *, context: TaskContext | None = None
    ) -> StrategyRuntime:
        """Builds the strategy of `config` (TF_CONFIG is already in the environment) and its runtime."""
        raise NotImplementedError(f"{cls.__name__} does not say how to start {config.name}.")

    @classmethod
    def serve(cls, cluster: ClusterConfig, model_dir: str, **grace_s: float) -> None:
        """What a task whose `Action` is SERVE runs (`StrategyConfig.action`): serve until the job
        ends. Overridden by parameter_server (its ps, worker and tf.data dispatcher tasks); no
        other strategy has serving tasks."""
        raise NotImplementedError(f"{cls.__name__} has no serving tasks.")

    @property
    def is_chief(self) -> bool:
        return self.context is None or self.context.is_chief

    # -- what a task decides from its strategy: a default here, overridden in the strategy's module

    @property
    def schedules(self) -> bool:
        """Whether the chief schedules step loops onto workers instead of running them.

        True only with a coordinator, which only parameter_server's runtime starts.
        """
        return self.coordinator is not None

    @property
    def spans_tasks(self) -> bool:
        """Whether a checkpoint holds variables of other tasks (the checkpoint writer traces its
        write once). True only with a coordinator: parameter_server's, whose ps tasks hold them.
        """
        return self.coordinator is not None

    def keeps_checkpoints(self, cluster: ClusterConfig) -> bool:
        """Whether this task's checkpoints are the run's (in model_dir) rather than a throw-away
        copy (a synchronous peer must take part in every save but its copy is not kept).

        The chief's, under every strategy; none overrides it.
        """
        return cluster.is_chief

    def checkpointer(
        self,
        options: CheckpointOptions,
        *,
        model_dir: str,
        cluster: ClusterConfig,
        checkpoint: tf.train.Checkpoint,
        global_step: tf.Variable,
    ) -> Checkpointer:
        """The task's checkpoint writer, as this strategy saves (Lightning's `checkpoint_io`):
        whether its checkpoints span tasks, whose are kept, and whether a save may write in the
        background (`options.background`: unless set False, wherever no other worker takes part
        in a save; preflight refuses True where one does)."""
        return Checkpointer(
            model_dir=model_dir,
            cluster=cluster,
            checkpoint=checkpoint,
            global_step=global_step,
            keep=options.keep,
            spans_tasks=self.spans_tasks,
            is_writer=self.keeps_checkpoints(cluster),
            background=options.background is not False
            and not self.config.saves_with_peers(cluster),
        )

    def eval_loop(self, trainer: Any) -> loops.EvalLoop:
        """The in-training evaluation pass: here split over the strategy's replicas.

        Overridden by one_device (a plain pass on its device, without the distributed
        iterator's cost) and parameter_server (a local pass on the chief, reading the
        variables from the ps tasks).
        """
        return loops.EvalLoop(trainer, self.strategy, distributed=True)

    def metrics_built(self, metrics: list) -> None:
        """Called with every metric the loops update, once built. Overridden by parameter_server,
        whose workers update them concurrently (its updates are made atomic)."""

    def answers_ps_save_requests(self, cluster: ClusterConfig) -> bool:
        """Whether this task saves a checkpoint when a preempted ps asks it to
        (`SaveOnPreemption`). Overridden by parameter_server: its chief does."""
        return False

    def run_loop(
        self, loop: Any, steps: int, *, stop: Callable[[], bool], final_save: FinalSave
    ) -> Any:
        """One `loop.train(steps)` call of the training task (`final_save`: what it may still
        save if it must exit now).

        Overridden by parameter_server: a cluster whose workers stopped answering (its
        watchdog's `ClusterStalledError`) saves what it can and ends the task.
        """
        return loop.train(steps, stop=stop)

    @property
    def averages_statistics(self) -> bool:
        """Whether the model's BatchNormalization statistics are averaged over the replicas after
        each loop (`statistics.StatisticsSync`): wherever more than one replica is in sync.
        No strategy overrides it; whether synchronous workers end with the same weights is
        checked at the end through `max_over_workers`.
        """
        return self.strategy.num_replicas_in_sync > 1

    def finish_job(self, cluster: ClusterConfig) -> None:
        """After training returned normally: leave in order (`shutdown`). Here a coordination
        service's tasks meet at a barrier and its leader exits last (multi_worker_mirrored,
        model_parallel's data_parallel); a task of one process returns at once. No strategy
        overrides it: parameter_server's serving tasks end in its `serve` instead.
        """
        shutdown.finish_synchronous_job(cluster)

    def max_over_workers(self, cluster: ClusterConfig) -> Callable[[int], int] | None:
        """An int -> int maximum over every synchronous worker (a collective); None without peers.

        Synchronous workers must take every decision together (stop, save, the loop size),
        or one would wait in a collective the others never join.
        """
        if self.schedules or cluster.is_local:
            return None
        strategy = self.strategy

        @tf.function
        def max_over_workers(value):
            votes = strategy.run(lambda: tf.reshape(value, [1]))
            return tf.reduce_max(strategy.gather(votes, axis=0))  # ReduceOp has no MAX

        return lambda value: int(max_over_workers(tf.constant(value, tf.int64)))

    def check_jit_compile(self, jit_compile: bool) -> None:
        """XLA compiles a step against variables on its own device: refuse it where they live on the
        ps tasks (a scheduled step runs on a worker) or on several devices of one process."""
        if not jit_compile:
            return
        if self.schedules:
            raise ConfigError(
                f"train.jit_compile=True cannot run {self.config.name}: a worker's step reads and "
                f"updates variables on the ps tasks, and TensorFlow's XLA compiles a step only "
                f"against variables on its own device ('Trying to access resource ... located in "
                f"device /job:ps/...'); set train.jit_compile=False, or use one_device, or "
                f"mirrored / multi_worker_mirrored on GPUs."
            )
        replicas_on_cpus = self.strategy.num_replicas_in_sync > 1 and all(
            "CPU" in d.upper() for d in self.strategy.extended.worker_devices
        )
        if not self.config.supports_jit_compile or replicas_on_cpus:
            raise ConfigError(
                f"train.jit_compile=True cannot run {self.config.name} over several devices of one "
                f"process: XLA puts every step on one device, away from variables on the others; use "
                f"it with one_device, or mirrored / multi_worker_mirrored on GPUs."
            )

    def make_train_loop(
        self,
        trainer: Any,
        global_step: tf.Variable,
        options: LoopOptions,
        cluster: ClusterConfig,
        *,
        agree: Callable[[int], int] | None = None,
        whole_table_warning_bytes: int | None = None,
    ) -> Any:
        """The loop that runs this task's training steps: in the task, or scheduled onto workers."""
        if options.jit_compile:  # now: raised while the step is traced it would not be exit 2
            tables.refuse_jit_compile(trainer.model)
        steps_per_loop = options.steps_per_loop
        if options.auto_steps_per_loop:
            initial = min(8, options.steps_per_loop)
            steps_per_loop = loops.StepsPerLoopTuner(
                initial=initial,
                maximum=loops.search_maximum(initial, options.train_steps, options.hook_spacing),
                agree=agree,
            )
        k = options.gradient_accumulation_steps
        step_fn = self.train_step_fn(trainer) if k == 1 else self.accumulating_step_fn(trainer, k)
        distributed = self.schedules or self.strategy.num_replicas_in_sync > 1
        if cluster.is_chief and distributed and whole_table_warning_bytes is not None:
            step_fn = whole_tables.warn_whole_reads(
                step_fn, trainer, whole_table_warning_bytes, self.config.name
            )
        return self.step_loop(
            trainer,
            global_step,
            steps_per_loop,
            cluster,
            jit_compile=options.jit_compile,
            step_fn=step_fn,
            batches_per_step=k,
        )

    def step_loop(
        self,
        trainer: Any,
        global_step: tf.Variable,
        steps_per_loop: Any,
        cluster: ClusterConfig,
        **common: Any,
    ) -> Any:
        """The loop object around `step_fn` (`common`: jit_compile, step_fn, batches_per_step).

        Here the synchronous `loops.TrainLoop`, run in this task; parameter_server overrides it
        with the loop its chief schedules onto the workers.
        """
        return loops.TrainLoop(self.strategy, trainer, global_step, steps_per_loop, **common)

    #: Whether the model must be called once eagerly after `prepare_model`, even when it is built
    #: already (model_parallel records the order its layers run in from that call).
    calls_model_once = False

    def prepare_model(self, model: Any) -> Any:
        """Called on the user's model before it is built (model_parallel wraps its layers here)."""
        return model

    def model_built(self, model: Any) -> None:
        """Called once the model is built and has been called, before the optimizer creates its slots
        (model_parallel chooses 'auto' stages and moves variables to their devices here)."""

    def state_built(self, trainer: Any) -> None:
        """Called once model, optimizer and metrics exist (model_parallel reports its placement here)."""

    def train_step_fn(self, trainer: Any) -> Any:
        """The per-replica step the loop runs (model_parallel may pipeline it over micro-batches)."""
        return trainer.train_step

    def gradients_fn(self, trainer: Any) -> Any:
        """batch -> (loss, gradients), train metrics updated: one pass of an accumulated update."""
        return trainer.compute_gradients

    def accumulating_step_fn(self, trainer: Any, k: int) -> Any:
        """The per-replica step of `train.gradient_accumulation_steps = k`: k batches, one update."""
        if trainer.overrides("train_step"):
            raise ConfigError(
                f"train.gradient_accumulation_steps={k} needs Trainer.compute_gradients, but "
                f"{type(trainer).__name__} overrides train_step; override compute_gradients (and "
                f"apply_gradients) instead, or set train.gradient_accumulation_steps = 1."
            )
        return accumulate.accumulating_step(self.gradients_fn(trainer), trainer.apply_gradients, k)
