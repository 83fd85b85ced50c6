"""tfdist_trainer.launch.console.quiet_stderr and launch.task_console in a process of their own: the
launcher's and a lone task's TensorFlow chatter stays off the console, real failures never do.
The console filter itself is tested in tests/unit/test_console_filter.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from test_console_filter import STARTUP


def test_quiet_stderr_drops_chatter_of_this_process_and_keeps_its_errors():
    """The launcher's own TensorFlow import: C++ lines (written to fd 2) and Python's alike."""
    chatter = [line.split("] ", 1)[1] for line in STARTUP[:3]]  # without the role prefix
    code = f"""
import os, sys
from tfdist_trainer.launch.console import quiet_stderr
with quiet_stderr():
    for line in {chatter!r}:
        os.write(2, (line + "\\n").encode())
    print("ValueError: a real problem", file=sys.stderr)
    print("W1123 08:00:00.000000 1 config.py:12] a warning", file=sys.stderr)
print("after the block", file=sys.stderr)
with quiet_stderr():
    raise RuntimeError("raised inside the block")
"""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=repo
    )
    lines = result.stderr.splitlines()
    assert lines[:3] == [
        "ValueError: a real problem",
        "W1123 08:00:00.000000 1 config.py:12] a warning",
        "after the block",
    ], result.stderr
    assert lines[3] == "Traceback (most recent call last):", result.stderr
    assert lines[-1] == "RuntimeError: raised inside the block"
    assert result.returncode == 1


def test_a_lone_task_keeps_chatter_in_its_log_and_exits_as_its_child_did(tmp_path):
    """tfdist_trainer.launch.task_console: the chatter the task writes (C++ lines to fd 2 included)
    stays off the console and goes to its log, held until the task names the log; a line before
    that is in it too; the process exits with the task's code, and dies of the task's signal."""
    chatter = [line.split("] ", 1)[1] for line in STARTUP[:3]]
    model_dir = tmp_path / "model"
    code = f"""
import os, signal, sys
from tfdist_trainer.launch import task_console
task_console.own_console({str(model_dir)!r}, chatter=False)
print("before the log", flush=True)
for line in {chatter!r}:
    os.write(2, (line + "\\n").encode())
os.makedirs({str(model_dir)!r}, exist_ok=True)
task_console.log_to({str(model_dir)!r}, "local")
print("[local] error: one sentence.", file=sys.stderr)
if sys.argv[1] == "signal":
    os.kill(os.getpid(), signal.SIGUSR1)
if sys.argv[1] == "sleep":
    print(os.getpid(), flush=True)
    signal.pause()
sys.exit(3)
"""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TFDIST_LAUNCHER_PID"}
    for how, returncode in (("exit", 3), ("signal", -10)):
        result = subprocess.run(
            [sys.executable, "-c", code, how],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=repo,
            env=env,
        )
        assert result.returncode == returncode, result.stdout + result.stderr
        assert result.stdout == "before the log\n", result.stdout
        assert result.stderr == "[local] error: one sentence.\n", result.stderr
    log = (model_dir / "logs" / "local.log").read_text().splitlines()
    # stdout and stderr are two pipes, each read in order; between them the order is the readers'
    # (seen under load: a stderr line before the earlier stdout one).
    head, stderr_lines = log[: len(chatter) + 2], [*chatter, "[local] error: one sentence."]
    assert sorted(head) == sorted(["before the log", *stderr_lines]), log
    assert [line for line in head if line != "before the log"] == stderr_lines, log
    assert oct((model_dir / "logs" / "local.log").stat().st_mode & 0o777) == "0o600"
    # the task dies with its console process (kill -9 of the pid a user or a scheduler knows)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "sleep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=repo,
        env=env,
    )
    assert proc.stdout.readline() == "before the log\n"
    task = int(proc.stdout.readline())
    assert task != proc.pid
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _alive(task) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(task), "the task outlived its console process"


def _alive(pid: int) -> bool:
    """A process that runs (a zombie left for its new parent to reap has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
