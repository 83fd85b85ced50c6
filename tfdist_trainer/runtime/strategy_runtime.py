"""A strategy at run time: the TensorFlow half of each gin strategy (`strategies` is the TF-free half).

A training task uses it in two steps, because devices must be configured
before TensorFlow's runtime starts and the strategy only after:

    strategy_runtime.prepare_devices(config)          # logical CPUs, GPU memory growth...
    runtime = strategy_runtime.start(config, context=context)
    runtime.strategy, runtime.coordinator             # the tf.distribute objects
    model = runtime.prepare_model(model)              # model_parallel places its layers here
    loop = runtime.make_train_loop(...)               # the step loop this strategy runs

Every decision that depends on the strategy lives here, as a one-line question
or one method: which loop runs the steps (`make_train_loop`), how synchronous
workers agree (`max_over_workers`, `agree`), whether a checkpoint spans tasks
(`spans_tasks`), whether XLA can compile the step (`check_jit_compile`).

`start` builds one `StrategyRuntime` holding everything it needs (the strategy,
the coordinator, the task's context, model_parallel's devices), so nothing
depends on having called another method first, except that a model must be
prepared before its step is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.cluster import WORKER, ClusterConfig
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.plan.strategies import (
    Mirrored,
    ModelParallel,
    MultiWorkerMirrored,
    OneDevice,
    ParameterServer,
    StrategyConfig,
)
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import loops, whole_tables
from tfdist_trainer.runtime.loops import accumulate


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

    @property
    def is_chief(self) -> bool:
        return self.context is None or self.context.is_chief

    @property
    def schedules(self) -> bool:
        """Whether the chief schedules step loops onto workers (parameter_server) instead of running them."""
        return self.coordinator is not None

    @property
    def spans_tasks(self) -> bool:
        """Whether a checkpoint holds variables of other tasks (parameter_server: the ps tasks')."""
        return self.coordinator is not None

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
        """XLA puts a step on one device: refuse it where the variables live on several of one process."""
        replicas_on_cpus = self.strategy.num_replicas_in_sync > 1 and all(
            "CPU" in d.upper() for d in self.strategy.extended.worker_devices
        )
        if jit_compile and (not self.config.supports_jit_compile or replicas_on_cpus):
            raise ConfigError(
                f"train.jit_compile=True cannot run {self.config.name} over several devices of one "
                f"process: XLA puts every step on one device, away from variables on the others; use "
                f"it with one_device, or mirrored / multi_worker_mirrored on GPUs."
            )

    def make_train_loop(
        self,
        trainer: Any,
        global_step: tf.Variable,
        experiment: Experiment,
        cluster: ClusterConfig,
        *,
        agree: Callable[[int], int] | None = None,
    ) -> Any:
        """The loop that runs this task's training steps: in the task, or scheduled onto workers."""
        steps_per_loop = experiment.steps_per_loop
        if experiment.auto_steps_per_loop:
            initial = min(8, experiment.steps_per_loop)
            hook_stops = (
                experiment.log_every_n_steps,
                experiment.eval_every_n_steps,
                experiment.checkpoint_every_n_steps,
            )
            steps_per_loop = loops.StepsPerLoopTuner(
                initial=initial,
                maximum=loops.search_maximum(
                    initial, experiment.train_steps, min(n for n in hook_stops if n)
                ),
                agree=agree,
            )
        k = experiment.gradient_accumulation_steps
        step_fn = self.train_step_fn(trainer) if k == 1 else self.accumulating_step_fn(trainer, k)
        distributed = self.schedules or self.strategy.num_replicas_in_sync > 1
        if cluster.is_chief and distributed and experiment.whole_table_warning_bytes is not None:
            step_fn = whole_tables.warn_whole_reads(
                step_fn, trainer, experiment.whole_table_warning_bytes, self.config.name
            )
        common = dict(jit_compile=experiment.jit_compile, step_fn=step_fn, batches_per_step=k)
        if not self.schedules:
            return loops.TrainLoop(self.strategy, trainer, global_step, steps_per_loop, **common)
        return loops.ScheduledTrainLoop(
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


# -- one builder per gin strategy ------------------------------------------------------------

_Starter = Callable[[Any, "TaskContext | None"], StrategyRuntime]
_DEVICE_SETUPS: dict[type, Callable[[Any], None]] = {}
_STARTERS: dict[type, _Starter] = {}


def _lookup(table: dict[type, Any], config: StrategyConfig) -> Any:
    for cls in type(config).__mro__:
        if cls in table:
            return table[cls]
    return None


def prepare_devices(config: StrategyConfig) -> None:
    """Device set-up that must happen before the TF runtime starts (logical CPUs...); most need none."""
    setup = _lookup(_DEVICE_SETUPS, config)
    if setup is not None:
        setup(config)


def start(config: StrategyConfig, *, context: TaskContext | None = None) -> StrategyRuntime:
    """Builds the strategy of `config` (TF_CONFIG is already in the environment) and its runtime."""
    starter = _lookup(_STARTERS, config)
    if starter is None:
        raise ConfigError(f"strategy {config.name or type(config).__name__} has no runtime.")
    return starter(config, context)


def _devices_of(config_type: type):
    def register(fn):
        _DEVICE_SETUPS[config_type] = fn
        return fn

    return register


def _starts(config_type: type):
    def register(fn):
        _STARTERS[config_type] = fn
        return fn

    return register


def _available_gpus() -> list:
    return tf.config.list_physical_devices("GPU")


@_starts(OneDevice)
def _one_device(config: OneDevice, context):
    device = config.device or ("/gpu:0" if _available_gpus() else "/cpu:0")
    return StrategyRuntime(config, tf.distribute.OneDeviceStrategy(device), context=context)


@_devices_of(Mirrored)
def _mirrored_devices(config: Mirrored) -> None:
    if config.devices is None and not _available_gpus():
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * config.num_logical_cpus
        )


@_starts(Mirrored)
def _mirrored(config: Mirrored, context):
    devices = config.devices
    if devices is None:
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
    return StrategyRuntime(config, tf.distribute.MirroredStrategy(devices=devices), context=context)


def communication_options(
    config: MultiWorkerMirrored,
) -> tf.distribute.experimental.CommunicationOptions:
    """The all-reduce implementation and timeout, from multi_worker_mirrored.* in gin."""
    implementation = getattr(
        tf.distribute.experimental.CommunicationImplementation, config.communication.upper()
    )
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=config.collective_timeout_s
    )


@_starts(MultiWorkerMirrored)
def _multi_worker_mirrored(config: MultiWorkerMirrored, context):
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=communication_options(config)
    )
    return StrategyRuntime(config, strategy, context=context)


@_starts(ParameterServer)
def _parameter_server(config: ParameterServer, context):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return StrategyRuntime(config, strategy, coordinator=coordinator, context=context)


# -- model_parallel --------------------------------------------------------------------------


@_devices_of(ModelParallel)
def _model_parallel_devices(config: ModelParallel) -> None:
    gpus = _available_gpus()
    if gpus:
        if config.gpu_memory_growth:
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
        if len(gpus) < config.num_devices:
            raise ConfigError(
                f"model_parallel.num_devices={config.num_devices} but only {len(gpus)} GPU(s) are "
                f"visible; lower num_devices or make more GPUs visible."
            )
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * config.num_devices
    )


@_starts(ModelParallel)
def _model_parallel(config: ModelParallel, context):
    kind = "GPU" if _available_gpus() else "CPU"
    if config.workers:
        strategy = _one_replica_per_worker(config.workers, kind)
        base = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
        devices = [
            base.replace(device_type=kind, device_index=i).to_string()
            for i in range(config.num_devices)
        ]
        host_device = base.replace(device_type="CPU", device_index=0).to_string()
    else:
        strategy = tf.distribute.get_strategy()
        local = tf.config.list_logical_devices(kind)
        if len(local) < config.num_devices:
            raise ConfigError(
                f"model_parallel.num_devices={config.num_devices} but this process has only "
                f"{len(local)} {kind} device(s); lower num_devices."
            )
        devices = [d.name for d in local[: config.num_devices]]
        host_device = tf.config.list_logical_devices("CPU")[0].name
    return ModelParallelRuntime(
        config, strategy, devices=devices, host_device=host_device, context=context
    )


def _one_replica_per_worker(workers: MultiWorkerMirrored, kind: str) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy with one replica per worker (its first GPU, or its CPU:0).

    A TFConfigClusterResolver makes one replica per local GPU; a SimpleClusterResolver
    built from it says how many accelerators a worker's replica has.
    """
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    one_replica = tf.distribute.cluster_resolver.SimpleClusterResolver(
        resolver.cluster_spec(),
        task_type=resolver.task_type,
        task_id=resolver.task_id,
        rpc_layer=resolver.rpc_layer or "grpc",
        num_accelerators={"GPU": 1} if kind == "GPU" else {},
    )
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=one_replica, communication_options=communication_options(workers)
    )


class ModelParallelRuntime(StrategyRuntime):
    """model_parallel in one task: the devices its plan places layers on, and the placed model.

    Attributes:
      devices: the plan's devices, index i for plan index i (this worker's, under data_parallel).
      host_device: this task's CPU, where inputs and the step's bookkeeping live.
      placement: the `placement.Placement` of the model `prepare_model` placed (one per runtime);
        `train_step_fn` builds the step of that model.
    """

    config: ModelParallel
    calls_model_once = True

    def __init__(
        self,
        config: ModelParallel,
        strategy: tf.distribute.Strategy,
        *,
        devices: list[str],
        host_device: str,
        context: TaskContext | None = None,
    ):
        super().__init__(config, strategy, context=context)
        self.devices = list(devices)
        self.host_device = host_device
        self.placement: Any = None

    def _log(self, line: str) -> None:
        if self.is_chief:
            logging.info("%s", line)
        else:
            logging.vlog(1, "%s", line)

    def prepare_model(self, model):
        from tfdist_trainer.model_parallel import placement as placement_lib

        self.placement = placement_lib.Placement(
            model,
            self.config.plan,
            self.devices,
            host_device=self.host_device,
            require_balance=self.config.require_balance,
            log=self._log,
        )
        return self.placement.apply()

    def model_built(self, model):
        self.placement.finalize()

    def state_built(self, trainer):
        """Checks every variable (and optimizer slot) is where the plan put it; writes placement.json."""
        from tfdist_trainer import variables

        for path, actual, wanted in self.placement.misplaced():
            logging.warning(
                "model_parallel: variable %s is on %s, not on its planned device %s",
                path,
                actual,
                wanted,
            )
        path = self.config.placement_path(self.context.model_dir if self.context else None)
        if path and self.is_chief:
            variables.write_report(
                path,
                self.placement.report(
                    optimizer=trainer.optimizer,
                    extra={
                        "num_micro_batches": self.config.num_micro_batches,
                        "data_parallel": self.config.data_parallel,
                    },
                ),
            )
            self._log(f"model_parallel placement written to {path}")

    def gradients_fn(self, trainer):
        from tfdist_trainer.model_parallel import step as step_lib

        step_lib.warn_pipelined_batch_norm(trainer, self.config.num_micro_batches)
        return step_lib.make_gradients_fn(
            trainer,
            num_micro_batches=self.config.num_micro_batches,
            loss_device=self._placed(trainer).loss_device(),
        )

    def _placed(self, trainer):
        """The placement of `trainer.model`; one sentence when the state was built without it."""
        if self.placement is None or self.placement.model is not trainer.model:
            raise ConfigError(
                "model_parallel's step needs the model its runtime placed: build the trainer's state "
                "with state.build_state(..., runtime=runtime) before asking for the step."
            )
        return self.placement

    def train_step_fn(self, trainer):
        from tfdist_trainer.model_parallel import step as step_lib

        placement = self._placed(trainer)
        if self.config.num_micro_batches > 1:
            self._log(
                f"model_parallel pipelines each replica batch over "
                f"{self.config.num_micro_batches} micro-batches"
            )
        return step_lib.make_train_step(
            trainer,
            num_micro_batches=self.config.num_micro_batches,
            loss_device=placement.loss_device(),
            log=self._log,
        )
