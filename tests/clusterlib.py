"""Helpers for tests that start real tfdist-train / tfdist-launch processes on 127.0.0.1.

No TensorFlow is mocked: every helper runs the real command lines a user runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from tfdist_trainer.launch.local_tasks import free_port_cluster  # noqa: F401  (the tests' port picker)
from tfdist_trainer.launch.process_group import signal_group
from tfdist_trainer.launch.supervisor import started_tasks
from tfdist_trainer.plan.cluster import tf_config_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Whether the charts extra is installed: `make demo` and `make bench` install it, `make test`
#: does not (Keras imports matplotlib.pyplot in every TensorFlow process when it is there,
#: 0.9 s of CPU each). Tests check the chart where it is, and its absence where it is not.
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PYTHON = sys.executable

# A small, fast MNIST configuration (the offline digits set when MNIST is absent).
FAST_MNIST = [
    f"--gin_file={REPO}/configs/mnist.gin",
    "--gin_bindings=MnistTrainer.filters=(8, 16)",
    "--gin_bindings=MnistTrainer.dense_units=32",
    "--gin_bindings=MnistTrainer.data_source='digits'",
    "--gin_bindings=train.log_every_n_steps=50",
]


def strategy_gin(name: str) -> str:
    return f"--gin_file={REPO}/configs/strategies/{name}.gin"


#: parameter_server.steps_per_loop of mnist_args, pinned so that the tests' step arithmetic (a run
#: that is not a whole number of loops, say) does not follow the package's default.
PSS_STEPS_PER_LOOP = 10


def mnist_args(strategy: str, model_dir: str, steps: int, *extra: str) -> list[str]:
    """tfdist-train's arguments for FAST_MNIST under `strategy`, `steps` steps into `model_dir`,
    then the flags `extra`."""
    args = [
        *FAST_MNIST,
        strategy_gin(strategy),
        f"--gin_bindings=train.train_steps={steps}",
        f"--model_dir={model_dir}",
        *extra,
    ]
    if strategy == "parameter_server":
        args.append(f"--gin_bindings=parameter_server.steps_per_loop={PSS_STEPS_PER_LOOP}")
    return args


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "1"
    env.update(extra or {})
    return env


def user_env(directory) -> dict[str, str]:
    """base_env with `directory` first on PYTHONPATH: where `--module=NAME` finds the user's own
    code (a test writes it to its tmp_path), as it would in the user's project directory."""
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([str(directory), env["PYTHONPATH"]])
    return env


def train_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "tfdist_trainer.cli", *args]


def assert_one_error_line(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """The run exited with `code` after ONE ``[role] error: ...`` line holding every fragment, no traceback."""
    assert result.returncode == code, f"exit {result.returncode}:\n{result.stdout[-5000:]}"
    assert "Traceback" not in result.stdout, result.stdout[-5000:]
    errors = [line for line in result.stdout.splitlines() if "] error: " in line]
    assert len(errors) == 1, result.stdout[-5000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def script_result(output: str) -> dict:
    """The JSON a test script printed on its last ``RESULT {...}`` line."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])


def launch_cmd(launch_args: Sequence[str], train_args: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", "tfdist_trainer.launch.main", *launch_args, "--", *train_args]


def run(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Runs a command to completion in its own process group; kills the group on timeout."""
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env or base_env()),
        cwd=cwd or REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # A launcher tears its cluster down on SIGTERM (its tasks live in their own sessions).
        signal_group(proc, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd)} did not finish within {timeout}s; output:\n{out[-5000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def tf_config(cluster: Mapping[str, list[str]], task_type: str, index: int) -> str:
    return tf_config_text(cluster, task_type, index)


def chief_gone_grace(strategy: str, grace_s: float) -> dict[str, list[str]]:
    """HandCluster per_task_args: parameter_server's serving tasks (ps, workers) exit `grace_s`
    after their chief is gone instead of the default minutes, so a test does not wait for them;
    other strategies have no serving tasks."""
    if strategy != "parameter_server":
        return {}
    return {t: [f"--chief_gone_grace_s={grace_s}"] for t in ("ps", "worker")}


class HandCluster:
    """Starts one tfdist-train process per task, each with its own TF_CONFIG, as a user would by hand."""

    def __init__(
        self,
        cluster: Mapping[str, list[str]],
        train_args: Sequence[str],
        log_dir: str,
        per_task_args: Mapping[str, Sequence[str]] | None = None,
        use_flags: bool = False,
    ):
        self.cluster = cluster
        self.train_args = list(train_args)
        self.log_dir = log_dir
        self.per_task_args = per_task_args or {}
        self.use_flags = use_flags
        self.procs: dict[str, subprocess.Popen] = {}

    def _args_for(self, task_type: str, index: int) -> tuple[list[str], dict[str, str]]:
        env = base_env()
        args = list(self.train_args) + list(self.per_task_args.get(task_type, ()))
        if self.use_flags:
            args += [f"--job_name={task_type}", f"--task_index={index}"]
            for t, flag in (
                ("ps", "ps_hosts"),
                ("worker", "worker_hosts"),
                ("chief", "chief_host"),
                ("evaluator", "evaluator_host"),
            ):
                if t in self.cluster:
                    args.append(f"--{flag}={','.join(self.cluster[t])}")
        else:
            env["TF_CONFIG"] = tf_config(self.cluster, task_type, index)
        return args, env

    def start(self, task_type: str, index: int) -> subprocess.Popen:
        args, env = self._args_for(task_type, index)
        log = open(os.path.join(self.log_dir, f"{task_type}-{index}.log"), "w")  # noqa: SIM115 (lives as long as the task)
        proc = subprocess.Popen(
            train_cmd(*args),
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[f"{task_type}:{index}"] = proc
        return proc

    def start_all(self, order: Sequence[str] = ("ps", "worker", "evaluator", "chief")) -> None:
        for task_type in order:
            for index in range(len(self.cluster.get(task_type, ()))):
                self.start(task_type, index)

    def run_all(self, timeout: float = 300) -> dict[str, int]:
        """Starts every task and waits for them all; returns their exit codes. Whatever still runs
        afterwards (after a failed wait, say) is killed, so no task outlives the test."""
        try:
            self.start_all()
            return self.wait_all(timeout=timeout)
        finally:
            self.kill_all()

    def wait(self, role: str, timeout: float = 300) -> int:
        try:
            return self.procs[role].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{role} did not finish within {timeout}s:\n{self.log(role)[-5000:]}"
            ) from None

    def wait_all(self, timeout: float = 300) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        return {role: self.wait(role, max(1, deadline - time.monotonic())) for role in self.procs}

    def log(self, role: str) -> str:
        with open(os.path.join(self.log_dir, role.replace(":", "-") + ".log")) as f:
            return f.read()

    def wait_for_train_step(self, model_dir: str, step: int, timeout: float = 300) -> float:
        """Waits for a train record at `step` or later; returns when it was seen (time.time()).

        Fails, with every task's log, when a task exits first or the time runs out.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            train = train_records(model_dir)
            if train and train[-1]["step"] >= step:
                return time.time()
            dead = {role: p.returncode for role, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise AssertionError(f"{dead} exited before step {step}\n{self.logs()}")
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached within {timeout}s\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {role}\n{self.log(role)[-tail:]}" for role in self.procs)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def read_jsonl(path: str) -> list[dict]:
    """Records of a JSON-lines file that may be being appended to (a torn last line is skipped)."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return records


def read_records(model_dir: str, name: str = "metrics.jsonl") -> list[dict]:
    return read_jsonl(os.path.join(model_dir, name))


def train_records(model_dir: str) -> list[dict]:
    return [r for r in read_records(model_dir) if r.get("kind") == "train"]


def train_step_reached(model_dir: str, step: int):
    """A predicate: the last train record whose step is >= `step`, else None."""

    def reached():
        records = [r for r in train_records(model_dir) if r["step"] >= step]
        return records[-1] if records else None

    return reached


class BackgroundJob:
    """A command (tfdist-launch or tfdist-train) running in the background in its own session, output in a file."""

    timeout_s: float = 300  # the default for wait() and wait_until()

    def __init__(self, cmd: Sequence[str], out_path: str, env: Mapping[str, str] | None = None):
        self.cmd = list(cmd)
        self.out_path = out_path
        self._out = open(out_path, "a")  # noqa: SIM115 (closed when the job ends)
        self.proc = subprocess.Popen(
            self.cmd,
            env=dict(env) if env else base_env(),
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def task_pid(self, role: str) -> int:
        """The pid of a task's current process, from the launcher's '[launch] started' lines (all
        tasks in one at the start: '... worker:0 (pid P, address), ...'; a restart's own)."""
        pids = [int(pid) for r, pid, _ in started_tasks(self.output()) if r == role]
        assert pids, f"the launcher did not report starting {role}:\n{self.output()[-4000:]}"
        return pids[-1]

    def output(self) -> str:
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def wait(self, timeout: float | None = None) -> int:
        timeout = timeout or self.timeout_s
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(
                f"{' '.join(self.cmd)} did not finish within {timeout}s:\n{self.output()[-6000:]}"
            ) from None

    def kill_group(self) -> None:
        """SIGKILL to the whole session (the launcher and every task it started)."""
        signal_group(self.proc, signal.SIGKILL)
        self.proc.wait()
        self._out.close()

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM (a graceful stop), then SIGKILL to the session after `grace_s`."""
        if self.proc.poll() is None:
            signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()

    def wait_until(self, what: str, predicate, timeout: float | None = None, poll_s: float = 0.02):
        """Polls `predicate` until it returns a true value; fails if the job ends first."""
        timeout = timeout or self.timeout_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the job exited ({self.proc.returncode}) before {what}:\n"
                    f"{self.output()[-6000:]}"
                )
            time.sleep(poll_s)
        self.kill_group()
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}:\n{self.output()[-6000:]}"
        )


def throw_away_checkpoints(model_dir) -> list[str]:
    """What synchronous peers' throw-away checkpoint directories left in model_dir (want none)."""
    from tfdist_trainer.runtime.checkpoints import PEER_DIRECTORY_PREFIX

    return sorted(
        n for n in os.listdir(model_dir) if n.startswith(PEER_DIRECTORY_PREFIX.rstrip("-"))
    )


def no_process_left(marker: str) -> list[str]:
    """Command lines of live processes that contain `marker` (a unique model_dir, say)."""
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            left.append(f"{pid}: {cmdline}")
    return left


def kill_processes_of(marker: str) -> None:
    """SIGKILLs, by pid, every live process whose command line contains `marker` (a test's tmp_path)."""
    for entry in no_process_left(marker):
        try:
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
