"""multi_worker_mirrored: synchronous data parallelism over worker processes (all-reduce).

The plan half of the strategy (TF-free); `runtime/strategies/multi_worker_mirrored.py` builds
it. Its workers run in lock-step, so every one must see the others before TF starts, and one
lost worker restarts them all. model_parallel's data_parallel mode borrows this topology.
"""

from __future__ import annotations

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.cluster import (
    CHIEF,
    EVALUATOR,
    PS,
    WORKER,
    ClusterConfig,
    ClusterConfigError,
    TaskAddress,
)
from tfdist_trainer.plan.strategies.base import GIN_MODULE, StrategyConfig, no_dispatcher


@gin.configurable("multi_worker_mirrored", module=GIN_MODULE)
class MultiWorkerMirrored(StrategyConfig):
    """Synchronous data parallelism over worker processes with all-reduce (ring or NCCL)."""

    name = "multi_worker_mirrored"
    holds_port_while_waiting = True
    shrinks = True  # the survivors restart from the last checkpoint, with the same global batch

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

    def validate(self, cluster: ClusterConfig) -> None:
        no_dispatcher(self.name, cluster)
        if cluster.num_tasks(PS):
            raise ClusterConfigError(
                "multi_worker_mirrored does not use parameter servers but the cluster has a ps job; "
                "remove the ps tasks or pick parameter_server."
            )

    def peers(self, cluster: ClusterConfig) -> list[TaskAddress]:
        if cluster.is_local or cluster.task_type == EVALUATOR:
            return []
        return [t for t in cluster.tasks((CHIEF, WORKER)) if t.name != cluster.role]

    def saves_with_peers(self, cluster: ClusterConfig) -> bool:
        return bool(self.peers(cluster))

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        return {WORKER: num_workers}

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        # Survivors of a broken all-reduce cannot go on: every synchronous worker restarts
        # and resumes from the last checkpoint.
        if failed_role.startswith(EVALUATOR):
            return [failed_role]
        return [r for r in roles if r.split(":")[0] in (CHIEF, WORKER)]
