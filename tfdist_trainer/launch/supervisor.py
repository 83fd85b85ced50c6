"""The local process supervisor: starts, watches, restarts and tears down one job's task processes.

Kubeflow's restart policies (Never, OnFailure, ExitCode) with a restart budget over a
window (`restart_budget`); every task in its own process group, SIGTERM then SIGKILL
after a grace period. A side-car (the evaluator) that is not restarted is given up
with one warning: it never ends the training it watches.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from tfdist_trainer.errors import EXIT_PREEMPTED, ConfigError, exit_code, is_retryable
from tfdist_trainer.io import checkpoint_names, records, storage
from tfdist_trainer.launch import parent_watch, process_group
from tfdist_trainer.launch.local_tasks import LocalTask
from tfdist_trainer.launch.output_relay import OutputRelay
from tfdist_trainer.launch.restart_budget import RestartBudget
from tfdist_trainer.launch.say import say
from tfdist_trainer.plan.cluster import EVALUATOR, WORKER, tf_config_text


class RestartPolicy:
    """Kubeflow's restart policies: Never, OnFailure, or ExitCode (only codes 128-255 are retried).

    Under ExitCode, 1-127 mean a permanent error (a bug, a bad config) and
    128-255 a transient one (killed by a signal, preempted, a peer lost).
    """

    NAMES = ("Never", "OnFailure", "ExitCode")

    def __init__(self, name: str, backoff_limit: int):
        if name not in self.NAMES:
            raise ConfigError(
                f"--restart_policy must be one of {', '.join(self.NAMES)}, got {name!r}."
            )
        if backoff_limit < 0:
            raise ConfigError(f"--backoff_limit must be >= 0, got {backoff_limit}.")
        self.name = name
        self.backoff_limit = backoff_limit

    def retries(self, code: int) -> bool:
        if self.name == "Never" or code == 0:
            return False
        return self.name == "OnFailure" or is_retryable(code)


#: Restarts a launcher gives a task the job cannot finish without (StrategyConfig.must_come_back)
#: under a policy that retries nothing.
NEEDED_TASK_RESTARTS = 3


def elastic_min_workers(strategy_config, flag_value: int | None, num_workers: int) -> int | None:
    """The smallest cluster an elastic job may shrink to, or None (not elastic).

    `--min_workers` wins over gin's multi_worker_mirrored.min_workers; only a strategy
    that says it shrinks (`StrategyConfig.shrinks`: multi_worker_mirrored) can (a
    parameter_server job goes on without a lost worker by itself).
    """
    value = flag_value if flag_value is not None else strategy_config.min_workers
    if value is None:
        return None
    if not strategy_config.shrinks:
        raise ConfigError(
            f"--min_workers applies to multi_worker_mirrored only (the strategy is "
            f"{strategy_config.name}); drop it."
        )
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= num_workers:
        raise ConfigError(
            f"--min_workers must be between 1 and --num_workers={num_workers}, got {value!r}."
        )
    return value


def exited(role: str, code: int) -> str:
    """'worker:1 exited with code 143 (preempted)': a task's end as the launcher says it."""
    return f"{role} exited with code {code}" + (" (preempted)" if code == EXIT_PREEMPTED else "")


class LocalCluster(OutputRelay):
    """Starts, watches, restarts and tears down the processes of one local job.

    What the tasks print goes to their logs and the console through `OutputRelay`
    (`output_relay`): this class decides when a process starts, restarts or ends.
    """

    def __init__(
        self,
        tasks: list[LocalTask],
        cluster: dict,
        train_args: list[str],
        log_dir: str,
        *,
        grace_s: float,
        strategy_config=None,
        policy: RestartPolicy | None = None,
        budget: RestartBudget | None = None,
        min_workers: int | None = None,
        model_dir: str | None = None,
    ):
        """`min_workers`: elastic multi_worker_mirrored (`elastic_min_workers`); `model_dir`: where
        a change of membership is recorded (metrics.jsonl)."""
        self.tasks = tasks
        self.cluster = cluster
        self.train_args = train_args
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.strategy_config = strategy_config
        self.policy = policy or RestartPolicy("Never", 0)
        self.budget = budget or RestartBudget(self.policy.backoff_limit, 300.0, 1.0)
        self.min_workers = min_workers
        self.model_dir = model_dir
        self.restarts = 0
        self._readers: list[threading.Thread] = []
        self._init_output()
        self._trained = threading.Event()  # a driving task exited 0: later gRPC errors are shutdown
        self._started_at: dict[str, float] = {}
        self._owes_startup: set[str] = set()  # (re)started tasks not yet seen listening
        #: Side-cars given up on (their failure did not end the job): one line each in the summary.
        self.given_up: list[str] = []

    def start(self) -> None:
        """Starts every task, said in one line whatever their number (a restart says its own)."""
        storage.make_private_dir(self.log_dir)
        for task in self.tasks:
            self._spawn(task, announce=False)
        say(f"started {', '.join(map(_started, self.tasks))}; logs: {self.log_dir}")

    def _spawn(self, task: LocalTask, *, announce: bool = True) -> None:
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if self.cluster:  # the evaluator stays in it, as in Kubeflow's TF_CONFIG
            env["TF_CONFIG"] = tf_config_text(self.cluster, task.task_type, task.index)
        env.setdefault("GRPC_FAIL_FAST", "use_caller")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ info lines drown the roles' progress
        env.update(parent_watch.environment(self.grace_s))  # the task ends if this launcher dies
        self._open_log(task)
        task.returncode = None
        task.process = subprocess.Popen(
            [sys.executable, "-m", "tfdist_trainer.cli", *self.train_args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._started_at[task.role] = time.monotonic()
        self._owes_startup.add(task.role)
        reader = threading.Thread(target=self._pump, args=(task, task.process), daemon=True)
        reader.start()
        self._readers.append(reader)
        if announce:
            say(f"started {_started(task)}; log: {task.log_path}")

    def _failed(self, task: LocalTask, code: int) -> int | None:
        """Restarts the failed task's group when the policy allows, or goes on without a task the
        strategy can lose (a parameter_server worker); else returns the job's exit code."""
        self._report_failure(task)
        ran_for_s = time.monotonic() - self._started_at[task.role]
        needed = self._needed_back(task, code)
        if needed:
            say(
                f"{task.role} must come back for the job to finish (the tf.data service's epoch "
                f"waits for its tf.data worker; parameter_server.data_service), whatever the "
                f"{self.policy.name} policy"
            )
        elif not self.policy.retries(code) or self.budget.exhausted():
            why = (
                f"the {self.policy.name} policy does not retry it"
                if not self.policy.retries(code)
                else self.budget.why_exhausted(task.role, ran_for_s, code)
            )
            return self._not_restarted(task, code, why)
        self._restart_group(task, code, ran_for_s, needed=needed)
        return None

    def _needed_back(self, task: LocalTask, code: int) -> bool:
        """A task the job cannot finish without, which the policy would not retry: restarted
        anyway, up to NEEDED_TASK_RESTARTS times."""
        return (
            self.strategy_config is not None
            and self.strategy_config.must_come_back(task.task_type)
            and not self.policy.retries(code)
            and self.restarts < NEEDED_TASK_RESTARTS
        )

    def _not_restarted(self, task: LocalTask, code: int, why: str) -> int | None:
        """A failed task that stays down (`why`): None where the job can go on without it (the
        evaluator, a task the strategy can lose, an elastic worker), else the job's exit code."""
        if task.task_type == EVALUATOR:
            # A side-car whose only job is evaluation never ends the training it watches.
            say(
                f"evaluation stopped: {exited(task.role, code)} and is not restarted ({why}); "
                f"training goes on without it (its log: {task.log_path})"
            )
            self.given_up.append(task.role)
            return None
        if self.strategy_config is not None and self.strategy_config.survives_loss_of(
            task.task_type
        ):
            return self._go_on_without(task, code, why)
        # Only a lost worker (killed, preempted, a peer gone): an error of its own (1-127: a
        # bug, a bad setting) would fail the smaller cluster the same way.
        if self.min_workers is not None and task.task_type == WORKER and is_retryable(code):
            return self._shrink(task, code, why)
        say(
            f"{exited(task.role, code)}; stopping the cluster because {why} "
            f"(its log: {task.log_path})"
        )
        return code

    def _go_on_without(self, task: LocalTask, code: int, why: str) -> int | None:
        """A task the strategy can lose: its live peers take over its work; the last one of its
        type ends the job (`code`), since no task is left to run the steps."""
        peers = [t for t in self.tasks if t.task_type == task.task_type]
        alive = [t for t in peers if t.returncode is None and t.process.poll() is None]
        if alive:
            say(
                f"{exited(task.role, code)} and is not restarted ({why}); the job goes on "
                f"with {len(alive)} of {len(peers)} {task.task_type}s, which take over its work "
                f"(its log: {task.log_path})"
            )
            return None
        say(
            f"{exited(task.role, code)} and was the last {task.task_type} left; stopping "
            f"the cluster because no {task.task_type} can run the job's steps ({why}; its log: "
            f"{task.log_path})"
        )
        return code

    def _restart_group(self, task: LocalTask, code: int, ran_for_s: float, *, needed: bool) -> None:
        """Stops the group the strategy restarts with `task` and starts it again after the
        budget's delay; `needed`: said as one of NEEDED_TASK_RESTARTS, not of the budget's window."""
        roles = [t.role for t in self.tasks]
        group = (
            self.strategy_config.restart_group(task.role, roles)
            if self.strategy_config
            else [task.role]
        )
        self.restarts += 1
        delay = self.budget.take(task.role, ran_for_s)
        budget = (
            f"restart {self.restarts}/{NEEDED_TASK_RESTARTS}"
            if needed
            else f"restart {self.budget.recent()}/{self.budget.limit} within "
            f"{self.budget.window_s:g}s"
        )
        say(
            f"{exited(task.role, code)}; restarting {', '.join(group)} in {delay:g}s "
            f"({budget}, policy {self.policy.name})"
        )
        members = [t for t in self.tasks if t.role in group]
        self._terminate(members, grace_s=min(self.grace_s, 2.0))
        time.sleep(delay)
        for member in members:
            self._spawn(member)

    def _shrink(self, lost: LocalTask, code: int, why: str) -> int | None:
        """Elastic multi_worker_mirrored: restarts the other workers without `lost`, or fails.

        All-reduce groups cannot change their membership, so every worker stops and
        the survivors start again as a smaller cluster (renumbered from 0, each
        keeping its address) from the last checkpoint. The global batch stays
        (Trainer.global_batch_size): each replica's batch grows.
        """
        workers = [t for t in self.tasks if t.task_type == WORKER]
        left = len(workers) - 1
        if left < self.min_workers:
            say(
                f"{exited(lost.role, code)} and is not restarted ({why}); stopping the cluster because "
                f"{left} worker(s) would be left, fewer than --min_workers={self.min_workers} "
                f"(its log: {lost.log_path})"
            )
            return code
        survivors = [t for t in workers if t is not lost]
        self._terminate(survivors, grace_s=min(self.grace_s, 2.0))
        self.tasks = [t for t in self.tasks if t is not lost]
        self.cluster = dict(self.cluster)
        self.cluster[WORKER] = [t.address for t in survivors]
        for index, task in enumerate(survivors):
            task.index = index
        say(
            f"{exited(lost.role, code)} and is not restarted ({why}); membership {len(workers)} -> "
            f"{left} workers (--min_workers={self.min_workers}): restarting "
            f"{', '.join(t.role for t in survivors)} from the last checkpoint with the same "
            f"global batch"
        )
        if self.model_dir:
            records.MetricsRecord(storage.join(self.model_dir, "metrics.jsonl")).write(
                kind="membership",
                step=checkpoint_names.latest_step(self.model_dir),
                workers=left,
                lost=lost.role,
                exit_code=code,
            )
        for task in survivors:
            self._spawn(task)
        return None

    def wait(self, startup_timeout_s: float) -> int:
        """Blocks until the job ends; returns its exit code."""
        from tfdist_trainer.plan.cluster import TaskAddress
        from tfdist_trainer.plan.network import is_listening

        while True:
            finished = []
            for task in self.tasks:
                if task.returncode is None and task.process.poll() is not None:
                    task.returncode = task.process.returncode
                    if task.returncode != 0:
                        _say_finished(finished)
                        finished = []
                        self._owes_startup.discard(task.role)
                        code = self._failed(task, exit_code(task.returncode))
                        if code is not None:
                            return code
                        break
                    finished.append(task.role)
                    if task.drives:
                        self._trained.set()
            _say_finished(finished)
            if all(
                t.returncode == 0 for t in self.tasks if t.drives and t.role not in self.given_up
            ):
                return 0
            # Only a task (re)started since it was last seen listening owes a start-up: one
            # that was not restarted keeps the time it came up (a restart of another task must
            # not make an evaluator that started long ago miss the deadline).
            for task in self.tasks:
                if (
                    not (task.listens_early and task.address)
                    or task.role not in self._owes_startup
                    or task.returncode is not None
                ):
                    continue
                if is_listening(TaskAddress(task.task_type, task.index, task.address), timeout=0.2):
                    self._owes_startup.discard(task.role)
                elif time.monotonic() - self._started_at[task.role] > startup_timeout_s:
                    say(
                        f"{task.role} at {task.address} did not come up within {startup_timeout_s:g}s; "
                        f"see {task.log_path}"
                    )
                    return 1
            time.sleep(0.2)

    def _terminate(self, tasks: list[LocalTask], grace_s: float) -> None:
        live = self._running(tasks)
        for task in live:
            process_group.signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for task in live:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{task.role} ignored SIGTERM for {grace_s:g}s; killing it")
        for task in tasks:  # kill stragglers and any children they left in their group
            if task.process is not None:
                process_group.signal_group(task.process, signal.SIGKILL)
                task.process.wait()

    @staticmethod
    def _running(tasks: list[LocalTask]) -> list[LocalTask]:
        return [t for t in tasks if t.process is not None and t.process.poll() is None]

    def stop(self, settle_s: float = 0.0) -> None:
        """Stops the drivers first (a chief saves on SIGTERM while its ps still serve), then the servers.

        After a job that succeeded, the servers first get up to `settle_s` to
        exit by themselves: they exit 0 about a second after the chief writes
        its done marker in model_dir, as they do on a real cluster. The wait
        starts again each time one of them exits: ps:0, the coordination
        leader, exits only after the others, so on a loaded machine the last
        exit can come well after the first.
        """
        self._terminate([t for t in self.tasks if t.drives], self.grace_s)
        servers = [t for t in self.tasks if not t.drives]
        running = self._running(servers)
        deadline = time.monotonic() + settle_s
        while running and time.monotonic() < deadline:
            time.sleep(0.1)
            still = self._running(servers)
            if len(still) < len(running):
                deadline = time.monotonic() + settle_s
            running = still
        finished = []
        for task in servers:
            if (
                task.process is not None
                and task.returncode is None
                and task.process.poll() is not None
            ):
                task.returncode = task.process.returncode
                if task.returncode == 0:
                    finished.append(task.role)
                else:
                    say(f"{task.role} exited with code {exit_code(task.returncode)}")
        _say_finished(finished)
        self._terminate(servers, self.grace_s)
        for reader in self._readers:
            reader.join(timeout=5)
        self._close_logs()


def _say_finished(roles: list[str]) -> None:
    """One line for the tasks seen exiting 0 together (``finished: ps:0, ps:1, worker:0``): the
    console of a 100-task job ends with a line, not a hundred."""
    if roles:
        say(f"finished: {', '.join(roles)}")


def _started(task: LocalTask) -> str:
    """``worker:0 (pid 4242, 127.0.0.1:5001)``: what a user needs to signal or reach a task."""
    return f"{task.role} (pid {task.process.pid}{', ' + task.address if task.address else ''})"


#: The launcher's start lines: one for all tasks at the job's start, one per task it restarts.
_STARTED_LINE = re.compile(r"^\[launch\] started (.+)$", re.M)
_STARTED_TASK = re.compile(r"(?:^|, )(\S+) \(pid (\d+)(?:, ([^)]+))?\)")


def started_tasks(output: str) -> list[tuple[str, str, str]]:
    """(role, pid, address or '') of every task start in the launcher's `output`, in order: what
    a tool that signals tasks (the chaos benchmark, the kill tests) reads."""
    return [task for line in _STARTED_LINE.findall(output) for task in _STARTED_TASK.findall(line)]


#: The launcher's lines for the tasks that exited 0 (`_say_finished`).
_FINISHED_LINE = re.compile(r"^\[launch\] finished: (.+)$", re.M)


def finished_tasks(output: str) -> list[str]:
    """The role of every task the launcher's `output` says exited 0, in order."""
    return [role for line in _FINISHED_LINE.findall(output) for role in line.split(", ")]
