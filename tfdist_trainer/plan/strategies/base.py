"""What every strategy's plan shares: the task's `Action` and the `StrategyConfig` base class.

A strategy is a pair of same-named modules: `plan/strategies/<name>.py` (TF-free) and
`runtime/strategies/<name>.py` (TensorFlow). The plan half is a strategy's *topology*: its
settings (the gin knobs), which cluster shapes it accepts (checked before TF starts), what
each task type does under it (train, serve or evaluate), which peers a task must see before
TF starts, which tasks compute steps, and what a launcher restarts when a task dies. The
CLI, `tfdist-launch` and the Kubernetes manifests read only this half, so it imports no
TensorFlow. The defaults here are those of a strategy that runs in one process; each
strategy's module overrides what differs.
"""

from __future__ import annotations

import enum

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

#: The module gin names every strategy under (`tfdist_trainer.plan.strategies.mirrored`): the one
#: module they shared before each got its own, so that a fully qualified name in a user's gin file
#: still resolves.
GIN_MODULE = "tfdist_trainer.plan.strategies"


class Action(enum.Enum):
    """What a task does under its strategy: the CLI runs the role module of its Action."""

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

    #: Whether a launcher may go on with fewer workers after one is lost for good (elastic
    #: training, `--min_workers`); multi_worker_mirrored overrides it.
    shrinks: bool = False

    #: Seconds without a finished scheduled closure before the chief gives up (0: never);
    #: only strategies with a coordinator schedule closures.
    stall_timeout_s: float = 0.0

    #: Whether the workers read the training data through the tf.data service (a dispatcher
    #: task; a data port on each worker): parameter_server.data_service.
    data_service: bool = False

    #: The fewest workers an elastic job may shrink to (None: not elastic), where the strategy
    #: `shrinks`: multi_worker_mirrored.min_workers.
    min_workers: int | None = None

    def check_job(self, *, gradient_accumulation_steps: int) -> None:
        """Raises ConfigError for a job-level setting (``train.*``) this strategy cannot honour."""

    def validate(self, cluster: ClusterConfig) -> None:
        """Raises ClusterConfigError when `cluster` cannot run this strategy."""
        no_dispatcher(self.name, cluster)
        if not cluster.is_local and cluster.task_type != EVALUATOR:
            extra = [t for t in cluster.cluster if t not in (CHIEF, EVALUATOR)]
            if extra or cluster.num_tasks(CHIEF) > 1:
                raise ClusterConfigError(
                    f"strategy {self.name} runs in one process but the cluster has {', '.join(extra)} tasks; "
                    f"drop TF_CONFIG or pick multi_worker_mirrored or parameter_server."
                )

    def action(self, cluster: ClusterConfig) -> Action:
        """What `cluster`'s task does: an evaluator follows checkpoints, any other task trains
        (parameter_server's workers, ps and dispatcher serve instead)."""
        return Action.EVALUATE if cluster.task_type == EVALUATOR else Action.TRAIN

    def peers(self, cluster: ClusterConfig) -> list[TaskAddress]:
        """Tasks that must be listening before this task starts TF."""
        return []

    def saves_with_peers(self, cluster: ClusterConfig) -> bool:
        """Whether other workers take part in each of this task's checkpoint saves (collectives):
        such a save cannot run on one task's thread (`train.async_checkpoint`). A ps writes its
        own part of parameter_server's checkpoints, but the chief alone starts the save."""
        return False

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


def no_dispatcher(strategy: str, cluster: ClusterConfig) -> None:
    """Refuses a tf.data dispatcher task: only parameter_server.data_service=True has a use for one."""
    if cluster.num_tasks(DISPATCHER):
        raise ClusterConfigError(
            f"the cluster has a tf.data dispatcher task, which only parameter_server.data_service=True "
            f"uses; remove it from the cluster (strategy {strategy})."
        )
