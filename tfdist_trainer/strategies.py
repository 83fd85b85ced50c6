"""Gin-configurable distribution strategies: one `train.strategy = @NAME` line picks one.

Each strategy knows three things beyond building its `tf.distribute.Strategy`:
which cluster shapes it accepts (checked before TF starts), what each task
type does under it (train, serve or evaluate), and which peers a task must see
before TF starts. That keeps the command line free of per-strategy `if`s.
"""

from __future__ import annotations

import abc
import enum
from typing import TYPE_CHECKING, Any

import gin

from tfdist_trainer.cluster import (
    CHIEF,
    EVALUATOR,
    PS,
    WORKER,
    ClusterConfig,
    ClusterConfigError,
    TaskAddress,
)
from tfdist_trainer.errors import ConfigError

if TYPE_CHECKING:  # TensorFlow is imported only once the cluster is known to be sane.
    import tensorflow as tf


class Action(enum.Enum):
    TRAIN = "train"  # runs the training loop (chief, lone process, or every MWMS worker)
    SERVE = "serve"  # hosts variables / runs scheduled functions until the job ends
    EVALUATE = "evaluate"  # side-car that follows checkpoints


class StrategyConfig(abc.ABC):
    """What the rest of the package needs to know about one kind of strategy."""

    name: str = ""
    #: Steps packed into one `tf.function` call (or one scheduled closure) unless set in gin.
    default_steps_per_loop: int = 100

    def validate(self, cluster: ClusterConfig) -> None:
        """Raises ClusterConfigError when `cluster` cannot run this strategy."""
        if not cluster.is_local and cluster.task_type != EVALUATOR:
            extra = [t for t in cluster.cluster if t not in (CHIEF, EVALUATOR)]
            if extra or cluster.num_tasks(CHIEF) > 1:
                raise ClusterConfigError(
                    f"strategy {self.name} runs in one process but the cluster has {', '.join(extra)} tasks; "
                    f"drop TF_CONFIG or pick multi_worker_mirrored or parameter_server."
                )

    def action(self, cluster: ClusterConfig) -> Action:
        return Action.EVALUATE if cluster.task_type == EVALUATOR else Action.TRAIN

    def peers(self, cluster: ClusterConfig) -> list[TaskAddress]:
        """Tasks that must be listening before this task starts TF."""
        return []

    #: Whether this task must listen on its port while it waits for peers (peers wait for it too).
    holds_port_while_waiting: bool = False

    #: Whether train.jit_compile can work: XLA compiles a step for one device.
    supports_jit_compile: bool = True

    #: Seconds without a finished scheduled closure before the chief gives up (0: never);
    #: only strategies with a coordinator schedule closures.
    stall_timeout_s: float = 0.0

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        """The task types and counts `tfdist-launch` starts for this strategy."""
        return {CHIEF: 1}

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        """The tasks to restart together when `failed_role` dies (a launcher's restart policy)."""
        return [failed_role]

    def survives_loss_of(self, task_type: str) -> bool:
        """Whether the job goes on, without a restart, when a task of this type dies.

        True only where the strategy itself absorbs the loss (parameter_server
        workers: the coordinator re-runs their closures on the others). The
        launcher and the Kubernetes manifests then keep the job alive.
        """
        return False

    def prepare_model(self, model: Any) -> Any:
        """Called on the user's model before it is built (model_parallel places its layers here)."""
        return model

    def train_step_fn(self, trainer: Any) -> Any:
        """The per-replica step the loop runs (model_parallel may pipeline it over micro-batches)."""
        return trainer.train_step

    def prepare_devices(self) -> None:  # noqa: B027 (optional: most strategies need no set-up)
        """Device set-up that must happen before the TF runtime starts (logical CPUs...)."""

    @abc.abstractmethod
    def create(self, cluster: ClusterConfig) -> tf.distribute.Strategy:
        """Builds the strategy; TF_CONFIG is already in the environment."""

    def create_coordinator(self, strategy: tf.distribute.Strategy) -> Any:
        """A ClusterCoordinator for strategies whose chief schedules work; else None."""
        return None


def _available_gpus() -> list:
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


@gin.configurable("one_device")
class OneDevice(StrategyConfig):
    """One device in one process: the first GPU if there is one, else the CPU."""

    name = "one_device"

    def __init__(self, device: str | None = None):
        self.device = device

    def create(self, cluster):
        import tensorflow as tf

        device = self.device or ("/gpu:0" if _available_gpus() else "/cpu:0")
        return tf.distribute.OneDeviceStrategy(device)


@gin.configurable("mirrored")
class Mirrored(StrategyConfig):
    """Synchronous replicas in one process: all local GPUs, or N logical CPUs without a GPU."""

    name = "mirrored"

    def __init__(self, devices: list[str] | None = None, num_logical_cpus: int = 2):
        if num_logical_cpus < 1:
            raise ConfigError(f"mirrored.num_logical_cpus must be >= 1, got {num_logical_cpus}.")
        self.devices = devices
        self.num_logical_cpus = num_logical_cpus

    def prepare_devices(self):
        import tensorflow as tf

        if self.devices is None and not _available_gpus():
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * self.num_logical_cpus
            )

    def create(self, cluster):
        import tensorflow as tf

        devices = self.devices
        if devices is None:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices=devices)


@gin.configurable("multi_worker_mirrored")
class MultiWorkerMirrored(StrategyConfig):
    """Synchronous data parallelism over worker processes with all-reduce (ring or NCCL)."""

    name = "multi_worker_mirrored"
    holds_port_while_waiting = True

    def __init__(self, communication: str = "auto", collective_timeout_s: float | None = None):
        if communication.lower() not in ("auto", "ring", "nccl"):
            raise ConfigError(
                f"multi_worker_mirrored.communication must be auto, ring or nccl, got {communication!r}."
            )
        self.communication = communication.lower()
        self.collective_timeout_s = collective_timeout_s

    def validate(self, cluster):
        if cluster.num_tasks(PS):
            raise ClusterConfigError(
                "multi_worker_mirrored does not use parameter servers but the cluster has a ps job; "
                "remove the ps tasks or pick parameter_server."
            )

    def peers(self, cluster):
        if cluster.is_local or cluster.task_type == EVALUATOR:
            return []
        return [t for t in cluster.tasks((CHIEF, WORKER)) if t.name != cluster.role]

    def launch_layout(self, *, num_workers, num_ps):
        return {WORKER: num_workers}

    def restart_group(self, failed_role, roles):
        # Survivors of a broken all-reduce cannot go on: every synchronous worker restarts
        # and resumes from the last checkpoint.
        if failed_role.startswith(EVALUATOR):
            return [failed_role]
        return [r for r in roles if r.split(":")[0] in (CHIEF, WORKER)]

    def create(self, cluster):
        import tensorflow as tf

        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=self.communication_options()
        )

    def communication_options(self) -> tf.distribute.experimental.CommunicationOptions:
        """The all-reduce implementation and timeout, from multi_worker_mirrored.* in gin."""
        import tensorflow as tf

        implementation = getattr(
            tf.distribute.experimental.CommunicationImplementation, self.communication.upper()
        )
        return tf.distribute.experimental.CommunicationOptions(
            implementation=implementation, timeout_seconds=self.collective_timeout_s
        )


@gin.configurable("parameter_server")
class ParameterServer(StrategyConfig):
    """Asynchronous training: variables on ps tasks, the chief schedules loops onto workers."""

    name = "parameter_server"
    holds_port_while_waiting = False

    def __init__(self, steps_per_loop: int = 10, stall_timeout_s: float = 300.0):
        """
        Args:
          steps_per_loop: steps per scheduled closure unless train.steps_per_loop is set.
          stall_timeout_s: the chief's watchdog. When no scheduled closure has finished for
            this long, the chief names the silent worker(s), saves a checkpoint and exits with
            the retryable code 200, so that a restart policy resumes the job. TF's gRPC has no
            keepalive: without it a permanently partitioned worker stalls the chief forever.
            Keep it far above one closure's time; 0 turns the watchdog off.
        """
        # No variable_partitioner: Keras 3 cannot differentiate the ShardedVariables it makes
        # (see DESIGN.md); large tables shard themselves instead (tfdist_trainer.layers).
        if (
            isinstance(steps_per_loop, bool)
            or not isinstance(steps_per_loop, int)
            or steps_per_loop < 1
        ):
            raise ConfigError(
                f"parameter_server.steps_per_loop must be an integer >= 1, got {steps_per_loop!r}."
            )
        if (
            isinstance(stall_timeout_s, bool)
            or not isinstance(stall_timeout_s, (int, float))
            or stall_timeout_s < 0
        ):
            raise ConfigError(
                f"parameter_server.stall_timeout_s must be a number of seconds >= 0 (0: no watchdog), "
                f"got {stall_timeout_s!r}."
            )
        self.default_steps_per_loop = steps_per_loop
        self.stall_timeout_s = float(stall_timeout_s)

    def validate(self, cluster):
        if cluster.is_local or not cluster.num_tasks(PS):
            raise ClusterConfigError(
                "parameter_server needs at least one ps task but the cluster has none; add ps tasks "
                "(--num_ps with tfdist-launch, --ps_hosts, or a 'ps' list in TF_CONFIG)."
            )
        if not cluster.num_tasks(WORKER):
            raise ClusterConfigError(
                "parameter_server needs at least one worker task; add worker tasks."
            )
        if not cluster.num_tasks(CHIEF):
            raise ClusterConfigError(
                "parameter_server needs a chief task to coordinate; add a chief to the cluster."
            )

    def action(self, cluster):
        if cluster.task_type in (PS, WORKER):
            return Action.SERVE
        return super().action(cluster)

    def peers(self, cluster):
        if cluster.task_type == CHIEF:
            return cluster.tasks((WORKER, PS))
        return []

    def launch_layout(self, *, num_workers, num_ps):
        return {CHIEF: 1, WORKER: num_workers, PS: num_ps}

    def restart_group(self, failed_role, roles):
        # A worker rejoins by itself (the coordinator re-runs its closures elsewhere meanwhile).
        # A coordinator cannot survive a lost ps: chief and ps restart from the last checkpoint.
        if failed_role.split(":")[0] in (CHIEF, PS):
            return [r for r in roles if r.split(":")[0] in (CHIEF, PS)]
        return [failed_role]

    def survives_loss_of(self, task_type):
        return task_type == WORKER

    def create(self, cluster):
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.experimental.ParameterServerStrategy(resolver)

    def create_coordinator(self, strategy):
        import tensorflow as tf

        return tf.distribute.coordinator.ClusterCoordinator(strategy)


def as_strategy_config(value: Any) -> StrategyConfig:
    """Accepts `@one_device` or `@one_device()` from gin, or a StrategyConfig instance."""
    if isinstance(value, StrategyConfig):
        return value
    if callable(value):
        made = value()
        if isinstance(made, StrategyConfig):
            return made
    raise ConfigError(
        f"train.strategy must be one of @one_device, @mirrored, @multi_worker_mirrored, "
        f"@parameter_server, @model_parallel; got {value!r}."
    )


@gin.configurable("model_parallel")
class ModelParallel(StrategyConfig):
    """One replica whose layers are placed on several devices, optionally pipelined over micro-batches.

    See tfdist_trainer/placement.py for how a plan places layers and how the
    pipelined step works.

    Args:
      plan: 'auto' (contiguous stages of about equal parameter bytes, in model.layers order), or
        {layer regex: device index} / [(layer regex, device index), ...] matched against layer
        names ('parent/child' for nested layers); a layer no pattern names runs with the one before.
      num_devices: devices the plan uses: the first GPUs when there are GPUs, else this many
        logical CPUs (created before TF starts).
      num_micro_batches: 1 runs the batch whole; M > 1 splits each replica batch into M
        micro-batches (GPipe: every forward, then every backward, gradients summed and applied
        once; stages on different devices overlap across micro-batches).
      data_parallel: None, or 'multi_worker_mirrored': each worker process is one model-parallel
        replica, gradients all-reduced across workers (configure it with multi_worker_mirrored.*).
      gpu_memory_growth: allocate GPU memory as needed instead of all at start.
      placement_file: JSON of the placement (layers, their variables' devices, bytes per device),
        written by the chief; a relative path is under --model_dir; None writes none.
      arithmetic_optimization: Grappler's arithmetic optimizer, process-wide. Off by default:
        on TF 2.21 it rewrites trees of adds inside the step loop into an AddN that becomes a
        TemporaryVariable, and once activations are large (seen at d_model=256, batch 32 x 128
        tokens) the *second* call of the loop fails with ALREADY_EXISTS
        '.../ArithmeticOptimizer/AddOpsRewrite_add_7/tmp_var/frame:.../iter:N' (one_device too).
    """

    name = "model_parallel"
    supports_jit_compile = (
        False  # XLA compiles for one device; the plan spreads a step over several
    )

    def __init__(
        self,
        plan: Any = "auto",
        num_devices: int = 2,
        num_micro_batches: int = 1,
        data_parallel: str | None = None,
        gpu_memory_growth: bool = False,
        placement_file: str | None = "placement.json",
        arithmetic_optimization: bool = False,
    ):
        from tfdist_trainer import placement as placement_lib

        if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
            raise ConfigError(
                f"model_parallel.num_devices must be an integer >= 1, got {num_devices!r}."
            )
        if (
            isinstance(num_micro_batches, bool)
            or not isinstance(num_micro_batches, int)
            or num_micro_batches < 1
        ):
            raise ConfigError(
                f"model_parallel.num_micro_batches must be an integer >= 1, got {num_micro_batches!r}."
            )
        if data_parallel in (None, "none", "None"):
            data_parallel = None
        elif data_parallel != "multi_worker_mirrored":
            raise ConfigError(
                f"model_parallel.data_parallel must be None or 'multi_worker_mirrored', "
                f"got {data_parallel!r}."
            )
        self.plan = placement_lib.parse_plan(plan, num_devices=num_devices)
        self.num_devices = num_devices
        self.num_micro_batches = num_micro_batches
        self.data_parallel = data_parallel
        self.gpu_memory_growth = bool(gpu_memory_growth)
        self.placement_file = placement_file
        self.arithmetic_optimization = bool(arithmetic_optimization)
        # Synchronous data parallelism over workers comes from multi_worker_mirrored (its gin knobs apply).
        self._workers = MultiWorkerMirrored() if data_parallel else None
        self.holds_port_while_waiting = bool(
            self._workers and self._workers.holds_port_while_waiting
        )
        self._devices: list[str] | None = None
        self._host_device: str | None = None
        self._is_chief = True
        self._placement: Any = None

    # -- the cluster: one process, or multi_worker_mirrored's workers -----------------
    def validate(self, cluster):
        if self._workers:
            self._workers.validate(cluster)
        else:
            super().validate(cluster)

    def peers(self, cluster):
        return self._workers.peers(cluster) if self._workers else []

    def launch_layout(self, *, num_workers, num_ps):
        return (
            self._workers.launch_layout(num_workers=num_workers, num_ps=num_ps)
            if self._workers
            else {CHIEF: 1}
        )

    def restart_group(self, failed_role, roles):
        return self._workers.restart_group(failed_role, roles) if self._workers else [failed_role]

    # -- devices and strategy ------------------------------------------------------------
    def prepare_devices(self):
        import tensorflow as tf

        if not self.arithmetic_optimization:
            tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
        gpus = _available_gpus()
        if gpus:
            if self.gpu_memory_growth:
                for gpu in gpus:
                    tf.config.experimental.set_memory_growth(gpu, True)
            if len(gpus) < self.num_devices:
                raise ConfigError(
                    f"model_parallel.num_devices={self.num_devices} but only {len(gpus)} GPU(s) are "
                    f"visible; lower num_devices or make more GPUs visible."
                )
            return
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * self.num_devices
        )

    def create(self, cluster):
        import tensorflow as tf

        kind = "GPU" if _available_gpus() else "CPU"
        self._is_chief = cluster.is_chief
        if self._workers:
            strategy = self._create_multi_worker(kind)
            base = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
            self._devices = [
                base.replace(device_type=kind, device_index=i).to_string()
                for i in range(self.num_devices)
            ]
            self._host_device = base.replace(device_type="CPU", device_index=0).to_string()
        else:
            strategy = tf.distribute.get_strategy()
            local = tf.config.list_logical_devices(kind)
            if len(local) < self.num_devices:
                raise ConfigError(
                    f"model_parallel.num_devices={self.num_devices} but this process has only "
                    f"{len(local)} {kind} device(s); lower num_devices."
                )
            self._devices = [d.name for d in local[: self.num_devices]]
            self._host_device = tf.config.list_logical_devices("CPU")[0].name
        return strategy

    def _create_multi_worker(self, kind: str) -> tf.distribute.Strategy:
        """MultiWorkerMirroredStrategy with one replica per worker (its first GPU, or its CPU:0).

        A TFConfigClusterResolver makes one replica per local GPU; a SimpleClusterResolver
        built from it says how many accelerators a worker's replica has.
        """
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        one_replica = tf.distribute.cluster_resolver.SimpleClusterResolver(
            resolver.cluster_spec(),
            task_type=resolver.task_type,
            task_id=resolver.task_id,
            rpc_layer=resolver.rpc_layer or "grpc",
            num_accelerators={"GPU": 1} if kind == "GPU" else {},
        )
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=one_replica,
            communication_options=self._workers.communication_options(),
        )

    # -- the model and the step ------------------------------------------------------------
    def _log(self, line: str) -> None:
        from absl import logging

        if self._is_chief:
            logging.info("%s", line)
        else:
            logging.vlog(1, "%s", line)

    def prepare_model(self, model):
        from tfdist_trainer import placement as placement_lib

        if self._devices is None:
            raise ConfigError(
                "model_parallel.prepare_model ran before create(); the runner must create the "
                "strategy first."
            )
        self._placement = placement_lib.Placement(
            model, self.plan, self._devices, host_device=self._host_device, log=self._log
        )
        return self._placement.apply()

    def train_step_fn(self, trainer):
        from absl import logging

        from tfdist_trainer import placement as placement_lib
        from tfdist_trainer import variables

        placement = self._placement
        if placement is None or placement.model is not trainer.model:
            raise ConfigError(
                "model_parallel.train_step_fn needs the model prepared by model_parallel.prepare_model."
            )
        if (
            not placement.finalized
        ):  # the model was never called eagerly: place it now (before any step)
            placement.finalize()
        for path, actual, wanted in placement.misplaced():
            logging.warning(
                "model_parallel: variable %s is on %s, not on its planned device %s",
                path,
                actual,
                wanted,
            )
        path = self._placement_path()
        if path and self._is_chief:
            variables.write_report(
                path,
                placement.report(
                    optimizer=trainer.optimizer,
                    extra={
                        "num_micro_batches": self.num_micro_batches,
                        "data_parallel": self.data_parallel,
                    },
                ),
            )
            self._log(f"model_parallel placement written to {path}")
        last = placement.units[-1] if placement.units else None
        loss_device = (
            self._devices[last.index] if last is not None and last.index is not None else None
        )
        if self.num_micro_batches > 1:
            self._log(
                f"model_parallel pipelines each replica batch over {self.num_micro_batches} micro-batches"
            )
        return placement_lib.make_train_step(
            trainer,
            num_micro_batches=self.num_micro_batches,
            loss_device=loss_device,
            log=self._log,
        )

    def _placement_path(self) -> str | None:
        import os

        from tfdist_trainer import storage

        if not self.placement_file:
            return None
        if os.path.isabs(self.placement_file) or "://" in self.placement_file:
            return self.placement_file
        model_dir = None
        try:
            from absl import flags

            if flags.FLAGS.is_parsed() and "model_dir" in flags.FLAGS:
                model_dir = flags.FLAGS.model_dir
        except Exception:  # noqa: BLE001 - no absl flags in this process (a library user): no file
            model_dir = None
        return storage.join(model_dir, self.placement_file) if model_dir else None
