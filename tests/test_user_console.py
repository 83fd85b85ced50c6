"""What a user sees (issue 33): `--help` that lists the command's own flags, a launcher console that
starts with the launcher's own line and shows task lines in a short format, one clear line when a
task fails, and no shutdown errors after a job that succeeded. Real commands, real clusters.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from clusterlib import (
    FAST_MNIST,
    HAS_MATPLOTLIB,
    PYTHON,
    REPO,
    base_env,
    launch_cmd,
    run,
    strategy_gin,
    train_cmd,
)

from tfdist_trainer.errors import EXIT_CONFIG
from tfdist_trainer.launch.console import ConsoleFilter

# -- --help -------------------------------------------------------------------------------------

TRAIN_FLAGS = ("--gin_file", "--gin_bindings", "--model_dir", "--job_name", "--chief_gone_grace_s")
LAUNCH_FLAGS = (
    "--num_workers=2",
    "--num_ps=1",
    "--restart_policy=Never",
    "--console_format=short",
    "--emit=",
    "--k8s_flavor=tfjob",
)


def _help(cmd: list[str], *args: str) -> str:
    result = subprocess.run(
        [*cmd, *(args or ["--help"])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=base_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout


def _check_help(out: str, program: str, names: tuple[str, ...], groups: tuple[str, ...]) -> None:
    for name in names:
        assert re.search(rf"^  {re.escape(name)}", out, re.M), f"{name} missing:\n{out}"
    for group in groups:
        assert re.search(rf"^{re.escape(group)}", out, re.M), f"group {group!r} missing:\n{out}"
    flag_lines = [line for line in out.splitlines() if line.startswith("  --")]
    assert len(flag_lines) >= len(names), out
    # one line per flag, with a help text: the flag, two spaces at least, then words
    assert all(re.match(r"^  --\S+ {2,}\S", line) for line in flag_lines), out
    examples = out.split("\nexamples:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in examples[:2]] == [program, program], out
    assert "--helpfull" in out.splitlines()[-1]
    assert "Try --helpfull" not in out and "USAGE:" not in out  # not absl's 4 lines


def test_train_help_lists_its_flags_grouped_with_examples():
    out = _help([PYTHON, "-m", "tfdist_trainer.cli"])
    _check_help(
        out,
        "tfdist-train",
        TRAIN_FLAGS,
        ("what to run:", "the cluster (instead of TF_CONFIG):", "fault tolerance:"),
    )
    # every flag of tfdist-train is listed, a new one too (an alias is not a flag of its own)
    names = subprocess.run(
        [
            PYTHON,
            "-c",
            "from absl import flags; import tfdist_trainer.cli; print(' '.join(f.name for f in "
            "flags.FLAGS.flags_by_module_dict()['tfdist_trainer.cli'] "
            "if not f.help.startswith('Alias for')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=True,
    ).stdout.split()
    assert "gin_file" in names
    for name in names:
        assert re.search(rf"^  --{name}\b", out, re.M), f"--{name} missing:\n{out}"


def test_launch_help_lists_its_flags_grouped_with_examples():
    out = _help([PYTHON, "-m", "tfdist_trainer.launch.main"])
    _check_help(
        out,
        "tfdist-launch",
        LAUNCH_FLAGS,
        ("the cluster:", "fault tolerance:", "the console:", "Kubernetes"),
    )
    assert "--in_private_network" not in out  # internal
    # -h and --helpshort are the same help; after '--', --help is the tasks' (not shown here)
    assert _help([PYTHON, "-m", "tfdist_trainer.launch.main"], "-h") == out
    assert _help([PYTHON, "-m", "tfdist_trainer.launch.main"], "--num_ps=3", "--helpshort") == out


def test_installed_console_scripts_print_the_same_help():
    """A console script's __main__ is a wrapper that defines no flags: absl alone printed 4 lines."""
    bin_dir = os.path.dirname(sys.executable)
    for script, module in (
        ("tfdist-train", "tfdist_trainer.cli"),
        ("tfdist-launch", "tfdist_trainer.launch.main"),
    ):
        path = os.path.join(bin_dir, script)
        if not os.path.exists(path):
            pytest.skip(f"{script} is not installed next to {sys.executable}")
        assert _help([path]) == _help([PYTHON, "-m", module])


def test_helpfull_stays_absls():
    result = subprocess.run(
        [PYTHON, "-m", "tfdist_trainer.launch.main", "--helpfull"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=base_env(),
    )
    assert "tfdist_trainer.launch.flags:" in result.stdout, result.stdout[:2000]
    assert "absl.logging:" in result.stdout  # every module's flags


# -- the launcher's console ----------------------------------------------------------------------

TIMEOUT_S = 300
#: absl's header, as the task logs keep it (``I1125 10:06:13.424594 1399 cli.py:139]``).
ABSL_HEADER = re.compile(r"^\[[\w:]+\] [IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.\-]+:\d+\] ")
#: The console's short format: ``[chief:0] 10:06:13 message``, ``[chief:0] 10:06:13 W message``.
SHORT = re.compile(r"^\[[\w:]+\] \d\d:\d\d:\d\d (?:[WEF] )?\S")
#: An error record on the console, in either format.
ERROR_LINE = re.compile(r"^\[[\w:]+\] (?:\d\d:\d\d:\d\d E |E\d{4} )")

#: Makes the chief slow to exit after training (its interpreter's teardown under load): the
#: servers used to be gone by then, and the chief's release of its remote functions failed.
SLOW_EXIT_MODULE = textwrap.dedent('''
    """The chief sleeps SLOW_EXIT_S seconds at interpreter exit, before TensorFlow's teardown."""

    import atexit
    import json
    import os
    import time

    _task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    if _task.get("type") == "chief":
        atexit.register(time.sleep, float(os.environ["SLOW_EXIT_S"]))
''')

FAILING_MODULE = textwrap.dedent('''
    """A Trainer whose model cannot be built, on every worker: a bug in the user's code."""

    import gin

    from recipes.mnist.trainer import MnistTrainer


    @gin.configurable
    class FailingTrainer(MnistTrainer):
        def build_model(self):
            raise RuntimeError("boom: the user's model cannot be built")
''')


def _project(tmp_path, name: str, text: str) -> dict[str, str]:
    """A user module in its own directory; the environment a user has (TensorFlow's C++ log
    level unset: its start-up lines are all printed)."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / f"{name}.py").write_text(text)
    env = base_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(project), env["PYTHONPATH"]])
    return env


@pytest.mark.cluster
def test_two_ps_console_reads_like_a_tool_and_has_no_error_after_success(tmp_path):
    """2 successful parameter_server runs with 2 ps (the flood of "Failed to remove function
    remotely" lines was intermittent; the second run makes the chief slow to exit, which made it
    certain): the first line is the launcher's, task lines are short, the placement table is one
    summary line (the whole table in the chief's log and model_dir), and no task prints an error."""
    env = _project(tmp_path, "slow_exit", SLOW_EXIT_MODULE)
    for run_index, slow_exit_s in enumerate((0, 3)):
        model_dir = tmp_path / f"model{run_index}"
        result = run(
            launch_cmd(
                ["--num_workers=2", "--num_ps=2"],
                [
                    *FAST_MNIST,
                    strategy_gin("parameter_server"),
                    "--gin_bindings=train.train_steps=40",
                    "--gin_bindings=parameter_server.steps_per_loop=10",
                    "--module=slow_exit",
                    f"--model_dir={model_dir}",
                ],
            ),
            env={**env, "SLOW_EXIT_S": str(slow_exit_s)},
            timeout=TIMEOUT_S,
        )
        out = result.stdout
        lines = out.splitlines()
        assert result.returncode == 0, out[-8000:]
        assert lines[0] == "[launch] parameter_server: chief:0, worker:0, worker:1, ps:0, ps:1", (
            out[:3000]
        )
        assert lines[-1] == "[launch] job succeeded", out[-3000:]
        errors = [line for line in lines if ERROR_LINE.match(line)]
        assert not errors, f"run {run_index} (chief exit +{slow_exit_s}s):\n" + "\n".join(
            errors[:20]
        )
        chief_log = (model_dir / "logs" / "chief-0.log").read_text(errors="replace")
        assert "Failed to remove function remotely" not in chief_log, chief_log[-4000:]
        # short task lines on the console, absl's header in the logs
        assert not [line for line in lines if ABSL_HEADER.match(line)], out[-4000:]
        assert re.search(r"^\[chief:0\] \d\d:\d\d:\d\d step 40/40 loss=", out, re.M), out
        assert re.search(
            r"^\[chief:0\] I\d{4} [\d:.]+ +\d+ controller\.py:\d+\] training done at step 40",
            chief_log,
            re.M,
        ), chief_log[-4000:]
        # the placement: one line on the console, the table in the log and model_dir
        placement = [line for line in lines if "variable placement" in line]
        assert len(placement) == 1 and SHORT.match(placement[0]), placement
        assert re.search(
            r"variable placement: \d+ variables, [\d.]+ [KM]iB: ps:0 .*, ps:1 .*; largest ",
            placement[0],
        ), placement[0]
        assert "imbalance" not in placement[0], placement[0]  # MNIST's few MiB: not worth it
        assert not [line for line in lines if "/device:CPU:0" in line], out[-4000:]
        assert re.search(r"^variable +shape +bytes +device$", chief_log, re.M), chief_log[:4000]
        report = json.loads((model_dir / "variable_placement.json").read_text())
        assert sorted(report["bytes_per_task"]) == [
            "/job:ps/replica:0/task:0",
            "/job:ps/replica:0/task:1",
        ]
        assert len(report["variables"]) == int(placement[0].split("placement: ")[1].split()[0])


@pytest.mark.cluster
def test_absl_format_and_chatter_on_request(tmp_path):
    """--console_format=absl brings absl's header back; --console_chatter prints TensorFlow's
    start-up lines, the launcher's own included (without it the first line is the launcher's)."""
    env = base_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = run(
        launch_cmd(
            ["--console_format=absl", "--console_chatter"],
            [
                *FAST_MNIST,
                strategy_gin("one_device"),
                "--gin_bindings=train.train_steps=5",
                f"--model_dir={tmp_path / 'model'}",
            ],
        ),
        env=env,
        timeout=TIMEOUT_S,
    )
    out = result.stdout
    lines = out.splitlines()
    assert result.returncode == 0, out[-8000:]
    first = next(i for i, line in enumerate(lines) if line.startswith("[launch] "))
    keep = ConsoleFilter(gpu=False)
    launcher_chatter = lines[:first]
    assert launcher_chatter and not [line for line in launcher_chatter if keep(line)], out[:3000]
    assert re.search(
        r"^\[local\] I\d{4} [\d:.]+ +\d+ run_context\.py:\d+\] step 5/5 ", out, re.M
    ), out[-4000:]
    # absl's header on every task line that has one (none in the short format)
    assert not [line for line in lines if SHORT.match(line)], out[-4000:]


@pytest.mark.cluster
def test_a_failing_task_prints_its_cause_and_one_traceback(tmp_path):
    """Both workers of a multi_worker_mirrored job fail alike: the console has one line with the
    first failure's cause, its traceback once, and one line for the other worker."""
    env = _project(tmp_path, "failing_model", FAILING_MODULE)
    model_dir = tmp_path / "model"
    result = run(
        launch_cmd(
            ["--num_workers=2"],
            [
                *FAST_MNIST,
                strategy_gin("multi_worker_mirrored"),
                "--module=failing_model",
                "--gin_bindings=train.trainer_cls=@FailingTrainer",
                f"--model_dir={model_dir}",
            ],
        ),
        env=env,
        timeout=TIMEOUT_S,
    )
    out = result.stdout
    lines = out.splitlines()
    assert result.returncode == 1, out[-8000:]  # the exit code is the task's
    assert lines[0].startswith("[launch] multi_worker_mirrored: "), out[:3000]
    cause = "RuntimeError: boom: the user's model cannot be built"
    failed = [
        i for i, line in enumerate(lines) if re.match(r"^\[launch\] worker:\d failed: ", line)
    ]
    assert len(failed) == 1, out[-8000:]
    first = lines[failed[0]]
    role = first.split()[1]
    log = model_dir / "logs" / f"{role.replace(':', '-')}.log"
    assert first == f"[launch] {role} failed: {cause} (traceback: {log})", first
    # its traceback, once, right after that line, every line with its role
    assert out.count("Traceback (most recent call last):") == 1, out[-8000:]
    assert lines[failed[0] + 1] == f"[{role}] Traceback (most recent call last):", out[-8000:]
    end = lines.index(f"[{role}] {cause}")
    assert all(line.startswith(f"[{role}] ") for line in lines[failed[0] + 1 : end]), out
    # the decision, as before; the other worker in one line if it died of the error too
    assert (
        f"[launch] {role} exited with code 1; stopping the cluster because the Never policy" in out
    )
    other = "worker:1" if role == "worker:0" else "worker:0"
    other_log = model_dir / "logs" / f"{other.replace(':', '-')}.log"
    if "Traceback (most recent call last)" in other_log.read_text(errors="replace"):
        assert f"[launch] {other} failed too: {cause} (traceback: {other_log})" in lines, out
    assert not [line for line in lines if line.startswith(f"[{other}]") and cause in line], out
    assert lines[-1] == "[launch] job failed with exit code 1", out[-3000:]


# -- a fresh machine: each command's console starts with the tool's own line ----------------------

#: What TensorFlow, CUDA, matplotlib and gin print at every start (on a fresh HOME, matplotlib
#: builds its font cache): in the task's log, never on a console.
STARTUP_WORDS = (
    "InitializeLog",
    "cuda drivers",
    "cuInit",
    "cpu_feature_guard",
    "oneDNN",
    "fontManager",
    "system_path_file_exists",
)


class _Timed:
    """A command started now with a fresh HOME (no matplotlib cache) and TensorFlow's C++ log level
    unset, as a user has it; `lines()` waits for it and returns (seconds since start, line) pairs,
    read from a pipe as they came."""

    def __init__(self, tmp_path, name: str, cmd: list[str], *, unbuffered: bool = True):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = base_env({"HOME": str(home)})
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        env.pop("MPLCONFIGDIR", None)
        if not unbuffered:  # a user's shell: Python block-buffers a pipe unless told otherwise
            env.pop("PYTHONUNBUFFERED", None)
        self._start = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._timed: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._timed.append((time.monotonic() - self._start, line.rstrip("\n")))

    def lines(self, code: int = 0) -> list[tuple[float, str]]:
        self._proc.wait(timeout=TIMEOUT_S)
        self._reader.join(timeout=10)
        out = "\n".join(line for _, line in self._timed)
        assert self._proc.returncode == code, f"exit {self._proc.returncode}:\n{out[-6000:]}"
        chatter = [line for _, line in self._timed if any(w in line for w in STARTUP_WORDS)]
        assert not chatter, "\n".join(chatter)
        assert "Traceback" not in out, out[-6000:]
        return self._timed


@pytest.mark.cluster
def test_every_console_starts_with_the_tools_own_line_on_a_fresh_home(tmp_path):
    """tfdist-train alone, then --mode=evaluate and --mode=export of its checkpoint, a typo, and
    tfdist-launch into a pipe without PYTHONUNBUFFERED: no start-up line of TensorFlow, CUDA,
    matplotlib or gin on any console (the task's log keeps them), a fatal error printed once,
    the optimizer left out of a checkpoint read said once, the launcher's lines as they come."""
    model_dir = tmp_path / "model"
    steps = [strategy_gin("one_device"), "--gin_bindings=train.train_steps=5"]
    train = _Timed(tmp_path, "train", train_cmd(*FAST_MNIST, *steps, f"--model_dir={model_dir}"))
    typo = _Timed(
        tmp_path,
        "typo",
        train_cmd(*FAST_MNIST, "--gin_bindings=train.train_stepz=5", f"--model_dir={model_dir}x"),
    )
    launch = _Timed(
        tmp_path,
        "launch",
        launch_cmd([], [*FAST_MNIST, *steps, f"--model_dir={tmp_path / 'launched'}"]),
        unbuffered=False,
    )
    [(_, error)] = typo.lines(EXIT_CONFIG)
    assert error.startswith("[local] error: bad gin configuration: ") and "train_stepz" in error
    assert not os.path.exists(f"{model_dir}x")  # no log, no model_dir for a configuration error

    trained = [line for _, line in train.lines()]
    # The launcher's short format on the console, absl's whole header in the log.
    assert re.match(r"^\[local\] \d\d:\d\d:\d\d train as local ", trained[0]), trained[0]
    assert not [line for line in trained if ABSL_HEADER.match(line)], trained
    log = (model_dir / "logs" / "local.log").read_text(errors="replace")
    assert re.search(r"^\[local\] I\d{4} [\d:.]+ +\d+ cli\.py:\d+\] train as local ", log, re.M)
    assert "InitializeLog" in log, log[:3000]
    # Keras imports matplotlib.pyplot when it is installed (make demo's charts extra).
    assert ("generated new fontManager" in log) == HAS_MATPLOTLIB, log[:3000]
    assert "training done at step 5" in trained[-1] and trained[-1].split(" ", 2)[2] in log

    modes = {
        mode: _Timed(
            tmp_path, mode, train_cmd(*FAST_MNIST, f"--mode={mode}", f"--model_dir={model_dir}")
        )
        for mode in ("evaluate", "export")
    }
    for mode, timed in modes.items():
        lines = [line for _, line in timed.lines()]
        assert re.search(
            r"^\[local\] [\d:]+ read \S+ckpt-5: the model's variables \(its optimizer", lines[0]
        ), lines
        mode_log = (model_dir / "logs" / f"{mode}.log").read_text(errors="replace")
        assert "could not be found in the restored object" not in mode_log, mode_log[-3000:]

    launched = launch.lines()
    assert launched[0][1].startswith("[launch] one_device: "), launched[:5]
    # line-buffered into a pipe: the launcher's first line long before its last
    assert launched[0][0] < launched[-1][0] - 2, launched
