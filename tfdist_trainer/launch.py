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


class LocalCluster:
    """Starts, watches and tears down the processes of one local job."""

    def __init__(self, tasks: list[LocalTask], cluster: dict, train_args: list[str], log_dir: str,
                 *, grace_s: float):
        self.tasks = tasks
        self.cluster = cluster
        self.train_args = train_args
        self.log_dir = log_dir
        self.grace_s = grace_s
        self._readers: list[threading.Thread] = []
        self._print_lock = threading.Lock()

    def start(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        for task in self.tasks:
            env = dict(os.environ)
            env.pop("TF_CONFIG", None)
            if self.cluster:
                env["TF_CONFIG"] = json.dumps({"cluster": self.cluster,
                                               "task": {"type": task.task_type, "index": task.index}})
            env.setdefault("GRPC_FAIL_FAST", "use_caller")
            env.setdefault("PYTHONUNBUFFERED", "1")
            task.log_path = os.path.join(self.log_dir, f"{task.task_type}-{task.index}.log")
            task.process = subprocess.Popen(
                [sys.executable, "-m", "tfdist_trainer.cli", *self.train_args], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
            reader = threading.Thread(target=self._pump, args=(task,), daemon=True)
            reader.start()
            self._readers.append(reader)
            _say(f"started {task.role} (pid {task.process.pid}{', ' + task.address if task.address else ''}); "
                 f"log: {task.log_path}")

    def _pump(self, task: LocalTask) -> None:
        prefix = f"[{task.role}]"
        with open(task.log_path, "ab") as log:
            for raw in iter(task.process.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                if not line.startswith(prefix):
                    line = f"{prefix} {line}"
                with self._print_lock:
                    print(line, flush=True)

    def wait(self, startup_timeout_s: float) -> int:
        """Blocks until the job ends; returns its exit code."""
        from tfdist_trainer.cluster import TaskAddress, is_listening

        started = time.monotonic()
        pending_start = [t for t in self.tasks if t.listens_early and t.address]
        while True:
            for task in self.tasks:
                if task.returncode is None and task.process.poll() is not None:
                    task.returncode = task.process.returncode
                    if task.returncode != 0:
                        _say(f"{task.role} exited with code {task.returncode}; stopping the cluster "
                             f"(its log: {task.log_path})")
                        return task.returncode
                    _say(f"{task.role} finished")
            if all(t.returncode == 0 for t in self.tasks if t.drives):
                return 0
            if pending_start:
                pending_start = [t for t in pending_start if t.returncode is None and not is_listening(
                    TaskAddress(t.task_type, t.index, t.address), timeout=0.2)]
                if pending_start and time.monotonic() - started > startup_timeout_s:
                    names = ", ".join(f"{t.role} at {t.address}" for t in pending_start)
                    _say(f"{names} did not come up within {startup_timeout_s:g}s; see "
                         f"{', '.join(t.log_path for t in pending_start)}")
                    return 1
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every live task's process group, then SIGKILL what is left after the grace period."""
        live = [t for t in self.tasks if t.process is not None and t.process.poll() is None]
        for task in live:
            _signal_group(task.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for task in live:
            try:
                task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"{task.role} ignored SIGTERM for {self.grace_s:g}s; killing it")
        for task in self.tasks:  # kill stragglers and any children they left in their group
            if task.process is not None:
                _signal_group(task.process, signal.SIGKILL)
                task.process.wait()
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

    local = LocalCluster(tasks, cluster, train_args, os.path.join(settings.model_dir, "logs"), grace_s=FLAGS.grace_s)
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
