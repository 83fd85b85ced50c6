"""parameter_server: asynchronous training, variables on ps tasks, the chief schedules onto workers.

The plan half of the strategy (TF-free); `runtime/strategies/parameter_server.py` builds it.
The one strategy whose tasks serve: workers, ps and the tf.data dispatcher run until the
chief ends, and a lost worker (or dispatcher) does not end the job.
"""

from __future__ import annotations

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
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
from tfdist_trainer.plan.strategies.base import (
    GIN_MODULE,
    Action,
    StrategyConfig,
    no_dispatcher,
)


@gin.configurable("parameter_server", module=GIN_MODULE)
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
        # (docs/design.md); large tables shard themselves instead (tfdist_trainer.sharding).
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

    def check_job(self, *, gradient_accumulation_steps: int) -> None:
        if gradient_accumulation_steps > 1 and self.data_service:
            raise ConfigError(
                f"train.gradient_accumulation_steps={gradient_accumulation_steps} cannot read "
                f"through the tf.data service (parameter_server.data_service=True), whose loop "
                f"stops at any batch when the data ends; set one of them back "
                f"(gradient_accumulation_steps = 1 or data_service = False)."
            )

    def validate(self, cluster: ClusterConfig) -> None:
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
            no_dispatcher(self.name, cluster)

    def action(self, cluster: ClusterConfig) -> Action:
        if self.serves(cluster.task_type):
            return Action.SERVE
        return super().action(cluster)

    def serves(self, task_type: str) -> bool:
        # Workers run the closures the chief schedules, ps hold variables and the dispatcher
        # hands out the data, until the chief ends.
        return task_type in (PS, WORKER, DISPATCHER)

    def peers(self, cluster: ClusterConfig) -> list[TaskAddress]:
        if cluster.task_type == CHIEF:
            return cluster.tasks((WORKER, PS, DISPATCHER))
        return []

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        layout = {CHIEF: 1, WORKER: num_workers, PS: num_ps}
        if self.data_service:
            layout[DISPATCHER] = 1
        return layout

    def runs_steps(self, task_type: str) -> bool:
        # The chief only schedules closures onto the workers; the ps only hold variables.
        return task_type in (WORKER, EVALUATOR)

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        # A worker rejoins by itself (the coordinator re-runs its closures elsewhere meanwhile).
        # A coordinator cannot survive a lost ps: chief and ps restart from the last checkpoint.
        if failed_role.split(":")[0] in (CHIEF, PS):
            return [r for r in roles if r.split(":")[0] in (CHIEF, PS)]
        return [failed_role]

    def must_come_back(self, task_type: str) -> bool:
        return self.data_service and task_type == WORKER

    def survives_loss_of(self, task_type: str) -> bool:
        # A restarted dispatcher (fault_tolerant_mode) replays its journal; readers wait for it.
        return task_type in (WORKER, DISPATCHER)
