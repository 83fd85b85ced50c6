"""Gin-configurable distribution strategies: one `train.strategy = @NAME` line picks one.

This module is a strategy's *topology*, and imports no TensorFlow: its
settings (the gin knobs), which cluster shapes it accepts (checked before TF
starts), what each task type does under it (train, serve or evaluate), which
peers a task must see before TF starts, which tasks compute steps, and what a
launcher restarts when a task dies. The CLI, `tfdist-launch` and the
Kubernetes manifests read only this. Building the `tf.distribute.Strategy`,
placing a model and choosing the step is the runtime's job
(`tfdist_trainer.runtime.strategy_runtime`), which the training task starts once TF
may start.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan import model_parallel_plan
from tfdist_trainer.plan.cluster import (
    CHIEF,
    DISPATCHER,
    EVALUATOR,
    PS,
    WORKER,
    ClusterConfig,
    ClusterConfigError,
    TaskAddress,
)
from tfdist_trainer.plan.task import TaskContext


class Action(enum.Enum):
    TRAIN = "train"  # runs the training loop (chief, lone process, or every MWMS worker)
    SERVE = "serve"  # hosts variables / runs scheduled functions until the job ends
    EVALUATE = "evaluate"  # side-car that follows checkpoints


class StrategyConfig:
    """One kind of strategy as the cluster sees it: its settings and its topology (no TensorFlow)."""

    name: str = ""
    #: Steps packed into one `tf.function` call (or one scheduled closure) unless set in gin.
    default_steps_per_loop: int = 100

    #: Whether this task must listen on its port while it waits for peers (peers wait for it too).
    holds_port_while_waiting: bool = False

    #: Whether train.jit_compile can work: XLA compiles a step for one device.
    supports_jit_compile: bool = True

    #: Seconds without a finished scheduled closure before the chief gives up (0: never);
    #: only strategies with a coordinator schedule closures.
    stall_timeout_s: float = 0.0

    def validate(self, cluster: ClusterConfig) -> None:
        """Raises ClusterConfigError when `cluster` cannot run this strategy."""
        _no_dispatcher(self.name, cluster)
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

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        """The task types and counts `tfdist-launch` starts for this strategy."""
        return {CHIEF: 1}

    def runs_steps(self, task_type: str) -> bool:
        """Whether tasks of this type compute training or evaluation steps (and so want accelerators).

        Not a ps, which only holds variables; not a chief that only schedules
        (parameter_server overrides this).
        """
        return task_type != PS

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        """The tasks to restart together when `failed_role` dies (a launcher's restart policy)."""
        return [failed_role]

    def serves(self, task_type: str) -> bool:
        """Whether tasks of this type serve until the job ends instead of finishing by themselves.

        The job is done when every task that does not serve has finished: what a
        launcher waits for, and what a JobSet's successPolicy targets.
        """
        return False

    def survives_loss_of(self, task_type: str) -> bool:
        """Whether the job goes on, without a restart, when a task of this type dies.

        True only where the strategy itself absorbs the loss (parameter_server
        workers: the coordinator re-runs their closures on the others). The
        launcher and the Kubernetes manifests then keep the job alive.
        """
        return False

    def must_come_back(self, task_type: str) -> bool:
        """Whether the job cannot finish until a lost task of this type is back, whatever the policy.

        True for parameter_server workers under data_service: the readers of
        the tf.data service wait for a lost tf.data worker's unfinished tasks
        until it registers again. A launcher restarts such a task even under
        the Never policy.
        """
        return False

    def task_context(self, cluster: ClusterConfig, model_dir: str) -> TaskContext:
        """What a Trainer of `cluster`'s task may know about it (`Trainer.context`)."""
        if cluster.is_local or cluster.task_type is None:
            return TaskContext(model_dir=model_dir, strategy=self.name)
        trainers = sum(cluster.num_tasks(t) for t in (CHIEF, WORKER) if self.runs_steps(t))
        return TaskContext(
            model_dir=model_dir,
            task_type=cluster.task_type,
            task_index=cluster.task_id,
            is_chief=cluster.is_chief,
            num_workers=max(1, trainers),
            strategy=self.name,
        )


@gin.configurable("one_device")
class OneDevice(StrategyConfig):
    """One device in one process: the first GPU if there is one, else the CPU."""

    name = "one_device"

    def __init__(self, device: str | None = None):
        self.device = device


@gin.configurable("mirrored")
class Mirrored(StrategyConfig):
    """Synchronous replicas in one process: all local GPUs, or N logical CPUs without a GPU."""

    name = "mirrored"

    def __init__(self, devices: list[str] | None = None, num_logical_cpus: int = 2):
        if not checks.is_positive_int(num_logical_cpus):
            raise ConfigError(f"mirrored.num_logical_cpus must be >= 1, got {num_logical_cpus!r}.")
        self.devices = devices
        self.num_logical_cpus = num_logical_cpus


@gin.configurable("multi_worker_mirrored")
class MultiWorkerMirrored(StrategyConfig):
    """Synchronous data parallelism over worker processes with all-reduce (ring or NCCL)."""

    name = "multi_worker_mirrored"
    holds_port_while_waiting = True

    def __init__(
        self,
        communication: str = "auto",
        collective_timeout_s: float | None = None,
        min_workers: int | None = None,
    ):
        """
        Args:
          communication: the all-reduce implementation: auto, ring or nccl.
          collective_timeout_s: how long a collective may wait for a peer.
          min_workers: elastic training under tfdist-launch (its --min_workers wins): when a
            worker fails past the restart policy, the launcher restarts the others from the
            last checkpoint without it, with the same global batch, while at least this many
            are left. None: a worker lost for good fails the job.
        """
        if min_workers is not None and not checks.is_positive_int(min_workers):
            raise ConfigError(
                f"multi_worker_mirrored.min_workers must be an integer >= 1 or None, got {min_workers!r}."
            )
        self.min_workers = min_workers
        if communication.lower() not in ("auto", "ring", "nccl"):
            raise ConfigError(
                f"multi_worker_mirrored.communication must be auto, ring or nccl, got {communication!r}."
            )
        self.communication = communication.lower()
        self.collective_timeout_s = collective_timeout_s

    def validate(self, cluster):
        _no_dispatcher(self.name, cluster)
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


@gin.configurable("parameter_server")
class ParameterServer(StrategyConfig):
    """Asynchronous training: variables on ps tasks, the chief schedules loops onto workers."""

    name = "parameter_server"
    holds_port_while_waiting = False

    def __init__(
        self, steps_per_loop: int = 10, stall_timeout_s: float = 300.0, data_service: bool = False
    ):
        """
        Args:
          steps_per_loop: steps per scheduled closure unless train.steps_per_loop is set.
          stall_timeout_s: the chief's watchdog. When no scheduled closure has finished for
            this long, the chief names the silent worker(s), saves a checkpoint and exits with
            the retryable code 200, so that a restart policy resumes the job. TF's gRPC has no
            keepalive: without it a permanently partitioned worker stalls the chief forever.
            Keep it far above one closure's time; 0 turns the watchdog off.
          data_service: read the training data through TensorFlow's tf.data service instead
            of a static share per worker: a dispatcher task (tfdist-launch and --emit=k8s add
            it) hands out the data in small splits, a tf.data worker in each training worker
            reads them, and each example of an epoch is read at most once even when workers
            die and come back (exactly once when none does). A finite dataset ends the run
            when its epoch is consumed. The dataset must be made of TF ops only (the tf.data
            workers cannot run Python: no py_function, numpy_function or from_generator).
        """
        # No variable_partitioner: Keras 3 cannot differentiate the ShardedVariables it makes
        # (see DESIGN.md); large tables shard themselves instead (tfdist_trainer.sharding).
        if not checks.is_positive_int(steps_per_loop):
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
        if not isinstance(data_service, bool):
            raise ConfigError(
                f"parameter_server.data_service must be True or False, got {data_service!r}."
            )
        self.default_steps_per_loop = steps_per_loop
        self.stall_timeout_s = float(stall_timeout_s)
        self.data_service = data_service

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
        if self.data_service and not cluster.num_tasks(DISPATCHER):
            raise ClusterConfigError(
                "parameter_server.data_service=True needs a tf.data dispatcher task but the cluster "
                "has none; tfdist-launch and --emit=k8s add one, or add a 'dispatcher' list to "
                "TF_CONFIG (--dispatcher_host with cluster flags)."
            )
        if not self.data_service:
            _no_dispatcher(self.name, cluster)

    def action(self, cluster):
        if self.serves(cluster.task_type):
            return Action.SERVE
        return super().action(cluster)

    def serves(self, task_type):
        # Workers run the closures the chief schedules, ps hold variables and the dispatcher
        # hands out the data, until the chief ends.
        return task_type in (PS, WORKER, DISPATCHER)

    def peers(self, cluster):
        if cluster.task_type == CHIEF:
            return cluster.tasks((WORKER, PS, DISPATCHER))
        return []

    def launch_layout(self, *, num_workers, num_ps):
        layout = {CHIEF: 1, WORKER: num_workers, PS: num_ps}
        if self.data_service:
            layout[DISPATCHER] = 1
        return layout

    def runs_steps(self, task_type):
        # The chief only schedules closures onto the workers; the ps only hold variables.
        return task_type in (WORKER, EVALUATOR)

    def restart_group(self, failed_role, roles):
        # A worker rejoins by itself (the coordinator re-runs its closures elsewhere meanwhile).
        # A coordinator cannot survive a lost ps: chief and ps restart from the last checkpoint.
        if failed_role.split(":")[0] in (CHIEF, PS):
            return [r for r in roles if r.split(":")[0] in (CHIEF, PS)]
        return [failed_role]

    def must_come_back(self, task_type):
        return self.data_service and task_type == WORKER

    def survives_loss_of(self, task_type):
        # A restarted dispatcher (fault_tolerant_mode) replays its journal; readers wait for it.
        return task_type in (WORKER, DISPATCHER)


def _no_dispatcher(strategy: str, cluster: ClusterConfig) -> None:
    if cluster.num_tasks(DISPATCHER):
        raise ClusterConfigError(
            f"the cluster has a tf.data dispatcher task, which only parameter_server.data_service=True "
            f"uses; remove it from the cluster (strategy {strategy})."
        )


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

    See tfdist_trainer/model_parallel/placement.py for how a plan places layers and how the
    pipelined step works.

    Args:
      plan: 'auto' (contiguous stages in call order balanced by parameter bytes, splitting nested
        layers such as a backbone's blocks until the stages balance within 10%), or
        {layer regex: device index} / [(layer regex, device index), ...] matched against layer
        paths at any depth ('gpt2_backbone/transformer_layer_1'); a nested layer no pattern names
        runs with its parent, a top-level one with the layer before.
      num_devices: devices the plan uses: the first GPUs when there are GPUs, else this many
        logical CPUs (created before TF starts).
      num_micro_batches: 1 runs the batch whole; M > 1 splits each replica batch into M
        micro-batches (GPipe: every forward, then every backward, gradients summed and applied
        once; stages on different devices overlap across micro-batches).
      data_parallel: None, or 'multi_worker_mirrored': each worker process is one model-parallel
        replica, gradients all-reduced across workers (configure it with multi_worker_mirrored.*).
      require_balance: a plan leaving a device with less than half its fair share of the bytes
        fails the start (exit 2) instead of warning.
      gpu_memory_growth: allocate GPU memory as needed instead of all at start.
      placement_file: JSON of the placement (layers, their variables' devices, bytes per device),
        written by the chief; a relative path is under the task's model_dir (`Trainer.context`);
        None writes none.
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
        require_balance: bool = False,
    ):
        if not checks.is_positive_int(num_devices):
            raise ConfigError(
                f"model_parallel.num_devices must be an integer >= 1, got {num_devices!r}."
            )
        if not checks.is_positive_int(num_micro_batches):
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
        self.plan = model_parallel_plan.parse_plan(plan, num_devices=num_devices)
        self.num_devices = num_devices
        self.num_micro_batches = num_micro_batches
        self.data_parallel = data_parallel
        self.gpu_memory_growth = bool(gpu_memory_growth)
        self.placement_file = placement_file
        self.require_balance = bool(require_balance)
        #: Synchronous data parallelism over workers comes from multi_worker_mirrored (its gin
        #: knobs apply); None: one process.
        self.workers: MultiWorkerMirrored | None = MultiWorkerMirrored() if data_parallel else None
        self.holds_port_while_waiting = bool(self.workers and self.workers.holds_port_while_waiting)

    # -- the cluster: one process, or multi_worker_mirrored's workers -----------------
    def validate(self, cluster):
        if self.workers:
            self.workers.validate(cluster)
        else:
            super().validate(cluster)

    def peers(self, cluster):
        return self.workers.peers(cluster) if self.workers else []

    def launch_layout(self, *, num_workers, num_ps):
        return (
            self.workers.launch_layout(num_workers=num_workers, num_ps=num_ps)
            if self.workers
            else {CHIEF: 1}
        )

    def runs_steps(self, task_type):
        return self.workers.runs_steps(task_type) if self.workers else super().runs_steps(task_type)

    def restart_group(self, failed_role, roles):
        return self.workers.restart_group(failed_role, roles) if self.workers else [failed_role]

    def placement_path(self, model_dir: str | None) -> str | None:
        """Where the chief writes the placement report: `placement_file`, under `model_dir` when relative."""
        if not self.placement_file:
            return None
        if os.path.isabs(self.placement_file) or "://" in self.placement_file:
            return self.placement_file
        if not model_dir:
            return None
        from tfdist_trainer.io import storage

        return storage.join(model_dir, self.placement_file)
