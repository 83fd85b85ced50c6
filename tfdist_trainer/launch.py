"""`tfdist-launch`: a whole cluster on this machine, one process per task, torn down cleanly.

    tfdist-launch --num_workers=2 --num_ps=1 [--evaluator] -- --gin_file=... --model_dir=...

The strategy (read from the same gin files the tasks use) decides which tasks
exist: parameter_server starts a chief, workers and ps; multi_worker_mirrored
starts workers only; one_device and mirrored a single process. Each task gets
its own TF_CONFIG with a free port on 127.0.0.1, its output is prefixed with
its role and copied to ``model_dir/logs/<role>.log``. The launcher exits with
the job's exit code and never leaves a process behind: tasks run in their
own process groups and get SIGTERM, then SIGKILL after a grace period
(a multi_worker_mirrored task ignores SIGTERM).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

from absl import app, flags

FLAGS = flags.FLAGS

flags.DEFINE_integer("num_workers", 2, "Worker tasks (parameter_server, multi_worker_mirrored).")
flags.DEFINE_integer("num_ps", 1, "Parameter-server tasks (parameter_server only).")
flags.DEFINE_boolean("evaluator", False, "Also start an evaluator side-car that follows checkpoints.")
flags.DEFINE_string("host", "127.0.0.1", "Address the tasks listen on.")
flags.DEFINE_float("startup_timeout_s", 120.0, "How long a task may take to start listening.")
flags.DEFINE_float("grace_s", 10.0, "Seconds between SIGTERM and SIGKILL at teardown.")
flags.DEFINE_enum("restart_policy", "Never", ["Never", "OnFailure", "ExitCode"],
                  "Like Kubeflow: restart failed tasks never, on any failure, or on exit codes 128-255.")
flags.DEFINE_integer("backoff_limit", 3, "Restarts allowed in the whole job before it fails.")
flags.DEFINE_float("restart_backoff_s", 1.0, "Delay before the first restart; doubles with each restart.")

EXIT_CONFIG = 2


@dataclasses.dataclass
class LocalTask:
    """One process of the local cluster."""

    task_type: str
    index: int
    address: str
    drives: bool          # the job is done when every driving task has exited 0
    listens_early: bool   # it should accept connections soon after it starts
    process: subprocess.Popen | None = None
    log_path: str = ""
    returncode: int | None = None

    @property
    def role(self) -> str:
        return f"{self.task_type}:{self.index}"


def _say(message: str) -> None:
    print(f"[launch] {message}", flush=True)


def _passthrough_settings(train_args: list[str]) -> argparse.Namespace:
    """Reads the gin files, bindings, modules and model_dir the tasks will get."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--gin_file", action="append", default=[])
    parser.add_argument("--gin_bindings", "--gin_param", action="append", default=[])
    parser.add_argument("--module", action="append", default=[])
    parser.add_argument("--model_dir")
    settings, _ = parser.parse_known_args(train_args)
    return settings


def plan_tasks(strategy_config, *, num_workers: int, num_ps: int, evaluator: bool, host: str) -> list[LocalTask]:
    """The tasks of the local cluster, each with a free port."""
    import portpicker

    from tfdist_trainer.cluster import EVALUATOR, ClusterConfig
    from tfdist_trainer.strategies import Action

    layout = strategy_config.launch_layout(num_workers=num_workers, num_ps=num_ps)
    layout = {t: n for t, n in layout.items() if n > 0}
    if evaluator:
        layout[EVALUATOR] = 1
    multi_task = sum(layout.values()) > 1
    tasks = []
    cluster = {t: [f"{host}:{portpicker.pick_unused_port()}" for _ in range(n)] for t, n in layout.items()}
    for task_type, addresses in cluster.items():
        for index, address in enumerate(addresses):
            config = ClusterConfig(cluster={t: tuple(a) for t, a in cluster.items()}, task_type=task_type, task_id=index)
            action = strategy_config.action(config)
            tasks.append(LocalTask(task_type, index, address if multi_task else "",
                                   drives=action != Action.SERVE,
                                   listens_early=action == Action.SERVE or strategy_config.holds_port_while_waiting))
    if multi_task:
        # Validates the planned cluster exactly as each task will (e.g. parameter_server without ps).
        strategy_config.validate(ClusterConfig(cluster={t: tuple(a) for t, a in cluster.items()},
                                               task_type=tasks[0].task_type, task_id=0))
    return tasks, (cluster if multi_task else {})


class RestartPolicy:
    """Kubeflow's restart policies: Never, OnFailure, or ExitCode (only codes 128-255 are retried).

    Under ExitCode, 1-127 mean a permanent error (a bug, a bad config) and
    128-255 a transient one (killed by a signal, preempted, a peer lost).
    """

    NAMES = ("Never", "OnFailure", "ExitCode")

    def __init__(self, name: str, backoff_limit: int):
        if name not in self.NAMES:
            raise ValueError(f"--restart_policy must be one of {', '.join(self.NAMES)}, got {name!r}.")
        if backoff_limit < 0:
            raise ValueError(f"--backoff_limit must be >= 0, got {backoff_limit}.")
        self.name = name
        self.backoff_limit = backoff_limit

    def retries(self, code: int) -> bool:
        if self.name == "Never" or code == 0:
            return False
        return self.name == "OnFailure" or 128 <= code <= 255


def exit_code(returncode: int) -> int:
    """A shell-style exit code: killed by signal N reads 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class LocalCluster:
    """Starts, watches, restarts and tears down the processes of one local job."""

    def __init__(self, tasks: list[LocalTask], cluster: dict, train_args: list[str], log_dir: str,
                 *, grace_s: float, strategy_config=None, policy: RestartPolicy | None = None,
                 restart_backoff_s: float = 1.0):
        self.tasks = tasks
        self.cluster = cluster
        self.train_args = train_args
        self.log_dir = log_dir
        self.grace_s = grace_s
        self.strategy_config = strategy_config
        self.policy = policy or RestartPolicy("Never", 0)
        self.restart_backoff_s = restart_backoff_s
        self.restarts = 0
        self._readers: list[threading.Thread] = []
        self._print_lock = threading.Lock()
        self._started_at: dict[str, float] = {}

    def start(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        for task in self.tasks:
            self._spawn(task)

    def _spawn(self, task: LocalTask) -> None:
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        if self.cluster:
            env["TF_CONFIG"] = json.dumps({"cluster": self.cluster,
                                           "task": {"type": task.task_type, "index": task.index}})
        env.setdefault("GRPC_FAIL_FAST", "use_caller")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ info lines drown the roles' progress
        task.log_path = os.path.join(self.log_dir, f"{task.task_type}-{task.index}.log")
        task.returncode = None
        task.process = subprocess.Popen(
            [sys.executable, "-m", "tfdist_trainer.cli", *self.train_args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self._started_at[task.role] = time.monotonic()
        reader = threading.Thread(target=self._pump, args=(task, task.process), daemon=True)
        reader.start()
        self._readers.append(reader)
        _say(f"started {task.role} (pid {task.process.pid}{', ' + task.address if task.address else ''}); "
             f"log: {task.log_path}")

    def _pump(self, task: LocalTask, process: subprocess.Popen) -> None:
        # A lone process calls itself 'local'; a cluster task already prints its own role.
        own_prefixes = (f"[{task.role}]", "[local]")
        with open(task.log_path, "ab") as log:
            for raw in iter(process.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                if not line.startswith(own_prefixes):
                    line = f"[{task.role}] {line}"
                with self._print_lock:
                    print(line, flush=True)

    def _failed(self, task: LocalTask, code: int) -> int | None:
        """Restarts the failed task's group when the policy allows; else returns the job's exit code."""
        if not self.policy.retries(code) or self.restarts >= self.policy.backoff_limit:
            why = (f"the {self.policy.name} policy does not retry it" if not self.policy.retries(code)
                   else f"the backoff limit of {self.policy.backoff_limit} restarts is reached")
            _say(f"{task.role} exited with code {code}; stopping the cluster because {why} "
                 f"(its log: {task.log_path})")
            return code
        roles = [t.role for t in self.tasks]
        group = self.strategy_config.restart_group(task.role, roles) if self.strategy_config else [task.role]
        self.restarts += 1
        delay = self.restart_backoff_s * 2 ** (self.restarts - 1)
        _say(f"{task.role} exited with code {code}; restarting {', '.join(group)} in {delay:g}s "
             f"(restart {self.restarts}/{self.policy.backoff_limit}, policy {self.policy.name})")
        members = [t for t in self.tasks if t.role in group]
        self._terminate(members, grace_s=min(self.grace_s, 2.0))
        time.sleep(delay)
        for member in members:
            self._spawn(member)
        return None

    def wait(self, startup_timeout_s: float) -> int:
        """Blocks until the job ends; returns its exit code."""
        from tfdist_trainer.cluster import TaskAddress, is_listening

        up: set[str] = set()
        while True:
            for task in self.tasks:
                if task.returncode is None and task.process.poll() is not None:
                    task.returncode = task.process.returncode
                    if task.returncode != 0:
                        up.discard(task.role)
                        code = self._failed(task, exit_code(task.returncode))
                        if code is not None:
                            return code
                        up.difference_update(t.role for t in self.tasks if t.returncode is None)
                        break
                    _say(f"{task.role} finished")
            if all(t.returncode == 0 for t in self.tasks if t.drives):
                return 0
            for task in self.tasks:
                if not (task.listens_early and task.address) or task.role in up or task.returncode is not None:
                    continue
                if is_listening(TaskAddress(task.task_type, task.index, task.address), timeout=0.2):
                    up.add(task.role)
                elif time.monotonic() - self._started_at[task.role] > startup_timeout_s:
                    _say(f"{task.role} at {task.address} did not come up within {startup_timeout_s:g}s; "
                         f"see {task.log_path}")
                    return 1
            time.sleep(0.2)

    def _terminate(self, tasks: list[LocalTask], grace_s: float) -> None:
        live = [t for t in tasks if t.process is not None and t.process.poll() is None]
        for task in live:
            _signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for task in live:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"{task.role} ignored SIGTERM for {grace_s:g}s; killing it")
        for task in tasks:  # kill stragglers and any children they left in their group
            if task.process is not None:
                _signal_group(task.process, signal.SIGKILL)
                task.process.wait()

    def stop(self) -> None:
        """Stops the drivers first (a chief saves on SIGTERM while its ps still serve), then the servers."""
        self._terminate([t for t in self.tasks if t.drives], self.grace_s)
        self._terminate([t for t in self.tasks if not t.drives], self.grace_s)
        for reader in self._readers:
            reader.join(timeout=5)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise _Interrupted(signum)


def main(argv: list[str]) -> None:
    train_args = argv[1:]
    settings = _passthrough_settings(train_args)
    from tfdist_trainer.cluster import ClusterConfigError
    from tfdist_trainer.config import ConfigError, load_experiment
    try:
        if FLAGS.num_workers < 0 or FLAGS.num_ps < 0:
            raise ConfigError("--num_workers and --num_ps must be >= 0.")
        if not settings.model_dir:
            raise ConfigError("--model_dir is required after '--' (the tasks share it); e.g. -- --model_dir=/tmp/run1.")
        experiment = load_experiment(settings.gin_file, settings.gin_bindings, settings.module)
        policy = RestartPolicy(FLAGS.restart_policy, FLAGS.backoff_limit)
        tasks, cluster = plan_tasks(experiment.strategy_config, num_workers=FLAGS.num_workers,
                                    num_ps=FLAGS.num_ps, evaluator=FLAGS.evaluator, host=FLAGS.host)
        try:  # a file by that name, or no permission: one sentence here, not a traceback from start()
            os.makedirs(os.path.join(settings.model_dir, "logs"), exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--model_dir {settings.model_dir} cannot be used as a directory ({e.strerror}); "
                              f"pick another path.") from None
    except (ConfigError, ClusterConfigError, ValueError) as e:
        print(f"[launch] error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)

    local = LocalCluster(tasks, cluster, train_args, os.path.join(settings.model_dir, "logs"), grace_s=FLAGS.grace_s,
                         strategy_config=experiment.strategy_config, policy=policy,
                         restart_backoff_s=FLAGS.restart_backoff_s)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    _say(f"{experiment.strategy_config.name}: {', '.join(t.role for t in tasks)}")
    code = 1
    try:
        local.start()
        code = local.wait(FLAGS.startup_timeout_s)
    except _Interrupted as e:
        _say(f"received {signal.Signals(e.signum).name}; stopping the cluster")
        code = 128 + e.signum
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        local.stop()
    _say(f"job {'succeeded' if code == 0 else f'failed with exit code {code}'}")
    sys.exit(code)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses the launcher's flags; a bad flag exits 2 with one line (absl prints two and exits 1)."""
    try:
        return FLAGS(argv)
    except flags.Error as e:
        print(f"[launch] error: {e}; see --helpshort for the flags.", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
