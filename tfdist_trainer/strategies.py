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

from tfdist_trainer.cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig, ClusterConfigError, TaskAddress

if TYPE_CHECKING:  # TensorFlow is imported only once the cluster is known to be sane.
    import tensorflow as tf


class Action(enum.Enum):
    TRAIN = "train"        # runs the training loop (chief, lone process, or every MWMS worker)
    SERVE = "serve"        # hosts variables / runs scheduled functions until the job ends
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

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        """The task types and counts `tfdist-launch` starts for this strategy."""
        return {CHIEF: 1}

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        """The tasks to restart together when `failed_role` dies (a launcher's restart policy)."""
        return [failed_role]

    def prepare_model(self, model: Any) -> Any:
        """Called on the user's model before it is built (model_parallel places its layers here)."""
        return model

    def train_step_fn(self, trainer: Any) -> Any:
        """The per-replica step the loop runs (model_parallel may pipeline it over micro-batches)."""
        return trainer.train_step

    def prepare_devices(self) -> None:
        """Device set-up that must happen before the TF runtime starts (logical CPUs...)."""

    @abc.abstractmethod
    def create(self, cluster: ClusterConfig) -> "tf.distribute.Strategy":
        """Builds the strategy; TF_CONFIG is already in the environment."""

    def create_coordinator(self, strategy: "tf.distribute.Strategy") -> Any:
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
            raise ValueError(f"mirrored.num_logical_cpus must be >= 1, got {num_logical_cpus}.")
        self.devices = devices
        self.num_logical_cpus = num_logical_cpus

    def prepare_devices(self):
        import tensorflow as tf
        if self.devices is None and not _available_gpus():
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * self.num_logical_cpus)

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
            raise ValueError(f"multi_worker_mirrored.communication must be auto, ring or nccl, got {communication!r}.")
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
        implementation = {
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
        }[self.communication]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation, timeout_seconds=self.collective_timeout_s)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


@gin.configurable("parameter_server")
class ParameterServer(StrategyConfig):
    """Asynchronous training: variables on ps tasks, the chief schedules loops onto workers."""

    name = "parameter_server"
    holds_port_while_waiting = False

    def __init__(self, steps_per_loop: int = 10):
        # No variable_partitioner: Keras 3 cannot differentiate the ShardedVariables it makes
        # (see DESIGN.md); large tables shard themselves instead (tfdist_trainer.layers).
        if steps_per_loop < 1:
            raise ValueError(f"parameter_server.steps_per_loop must be >= 1, got {steps_per_loop}.")
        self.default_steps_per_loop = steps_per_loop

    def validate(self, cluster):
        if cluster.is_local or not cluster.num_tasks(PS):
            raise ClusterConfigError(
                "parameter_server needs at least one ps task but the cluster has none; add ps tasks "
                "(--num_ps with tfdist-launch, --ps_hosts, or a 'ps' list in TF_CONFIG)."
            )
        if not cluster.num_tasks(WORKER):
            raise ClusterConfigError("parameter_server needs at least one worker task; add worker tasks.")
        if not cluster.num_tasks(CHIEF):
            raise ClusterConfigError("parameter_server needs a chief task to coordinate; add a chief to the cluster.")

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
    raise ValueError(
        f"train.strategy must be one of @one_device, @mirrored, @multi_worker_mirrored, "
        f"@parameter_server; got {value!r}."
    )
