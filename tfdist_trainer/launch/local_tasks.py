"""The tasks of a local cluster: which processes the strategy needs, each with a free port."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Mapping


@dataclasses.dataclass
class LocalTask:
    """One process of the local cluster."""

    task_type: str
    index: int
    address: str
    drives: bool  # the job is done when every driving task has exited 0
    listens_early: bool  # it should accept connections soon after it starts
    process: subprocess.Popen | None = None
    log_path: str = ""
    returncode: int | None = None

    @property
    def role(self) -> str:
        return f"{self.task_type}:{self.index}"


def free_port_cluster(
    layout: Mapping[str, int], host: str = "127.0.0.1", *, second_port: tuple[str, ...] = ()
) -> dict[str, list[str]]:
    """A cluster spec with a free port on `host` per task, e.g. layout {"chief": 1, "worker": 2}.

    Tasks of the types in `second_port` also get the port after theirs free
    (a parameter_server worker's tf.data worker listens there). The one place a
    local cluster gets its ports: the launcher, the benchmarks and the tests
    (launch/ports.py says why they are not the kernel's ephemeral ones).
    """
    from tfdist_trainer.launch.ports import pick_port
    from tfdist_trainer.plan.cluster import DATA_WORKER_PORT_OFFSET

    taken: set[int] = set()

    def pick(paired: bool) -> int:
        span = DATA_WORKER_PORT_OFFSET + 1 if paired else 1
        port = pick_port(taken, span=span)
        taken.update(range(port, port + span))
        return port

    return {
        t: [f"{host}:{pick(t in second_port)}" for _ in range(n)] for t, n in layout.items() if n
    }


def plan_tasks(
    strategy_config, *, num_workers: int, num_ps: int, evaluator: bool, host: str
) -> list[LocalTask]:
    """The tasks of the local cluster, each with a free port."""
    from tfdist_trainer.plan.cluster import ClusterConfig
    from tfdist_trainer.plan.strategies import Action
    from tfdist_trainer.plan.task_layout import task_layout

    # The same layout as the Kubernetes manifests (--emit=k8s) of this job.
    layout = task_layout(
        strategy_config, num_workers=num_workers, num_ps=num_ps, evaluator=evaluator
    )
    multi_task = sum(layout.values()) > 1
    tasks = []
    # A task that must come back does so at the same addresses: under parameter_server.data_service
    # that is a worker, whose tf.data worker listens on the port after its own.
    cluster = free_port_cluster(
        layout, host, second_port=tuple(t for t in layout if strategy_config.must_come_back(t))
    )
    for task_type, addresses in cluster.items():
        for index, address in enumerate(addresses):
            config = ClusterConfig(
                cluster={t: tuple(a) for t, a in cluster.items()},
                task_type=task_type,
                task_id=index,
            )
            action = strategy_config.action(config)
            tasks.append(
                LocalTask(
                    task_type,
                    index,
                    address if multi_task else "",
                    drives=action != Action.SERVE,
                    listens_early=action == Action.SERVE
                    or strategy_config.holds_port_while_waiting,
                )
            )
    if multi_task:
        # Validates the planned cluster exactly as each task will (e.g. parameter_server without ps).
        strategy_config.validate(
            ClusterConfig(
                cluster={t: tuple(a) for t, a in cluster.items()},
                task_type=tasks[0].task_type,
                task_id=0,
            )
        )
    return tasks, (cluster if multi_task else {})
