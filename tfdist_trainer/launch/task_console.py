"""tfdist-train's own console when no launcher reads its output: the task's log keeps every line.

Under tfdist-launch a task's output goes through the launcher, which copies it
to ``model_dir/logs/<task>.log`` and shows the console only the lines that
:class:`~tfdist_trainer.launch.console.ConsoleFilter` keeps. A task started by
hand (or by a scheduler, with a local model_dir) had no one doing that, so its
console began with TensorFlow's C++ start-up lines, a failed ``cuInit`` on a
machine without a GPU, and matplotlib building its font cache. Those come from
C++ and from imports before Python can filter anything, and
``TF_CPP_MIN_LOG_LEVEL`` does not reach them all.

:func:`own_console` splits the process in two before TensorFlow is imported:
the child runs the task with its stdout and stderr on pipes; the parent, which
never imports TensorFlow, copies every line to the task's log and the kept
lines to the console (as the launcher shows them: absl's header cut to the
time), forwards signals to the child, and exits as the child did. A second
process rather than a thread reading a pipe of our own: a task that dies in C++
(a CHECK failure, a segfault) or leaves through ``os._exit`` takes such a
thread with it, and the last lines, the ones that say why, were lost with it.

The log is opened only once the task has created its model_dir (the child
says so with :func:`log_to`): a configuration error must leave no model_dir
behind, and its console is the one-line error alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

from tfdist_trainer.io import storage
from tfdist_trainer.launch import console, parent_watch

#: Set in the task's process when its output goes through the parent (its children inherit it).
FILTERED_ENV = "TFDIST_TASK_CONSOLE"
#: A line the child writes to say where its log goes; the parent acts on it and prints nothing.
_LOG_MARK = b"\x1etfdist-task-console log="
_FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: How long the parent reads on after the child exited (a grandchild may hold the pipes).
_DRAIN_S = 5.0


def wanted(model_dir: str | None, *, chatter: bool, environ=os.environ) -> bool:
    """Whether this process should split: a log can be kept (a local model_dir), no launcher
    or split parent reads its output already, `chatter` (show every line) is off, and
    TensorFlow is not imported yet (a process with TF's threads must not fork)."""
    return bool(
        model_dir
        and storage.local_path(model_dir) is not None
        and not chatter
        and not environ.get(parent_watch.LAUNCHER_PID_ENV)
        and not environ.get(FILTERED_ENV)
        and "tensorflow" not in sys.modules
    )


def own_console(model_dir: str | None, *, chatter: bool) -> None:
    """Returns in the process that runs the task; when splitting is `wanted`, that is a child,
    and this process becomes the console's filter and never returns (it exits with the task)."""
    if not wanted(model_dir, chatter=chatter):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = [os.pipe(), os.pipe()]  # the task's stdout, its stderr
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_task(pipes, parent)
        return
    for _, write_end in pipes:
        os.close(write_end)
    os._exit(_serve(pid, [read_end for read_end, _ in pipes]))


def log_to(model_dir: str, name: str) -> None:
    """Tells the console's parent (if there is one) to keep the task's log at
    ``model_dir/logs/<name>.log``, with every line the task wrote so far; nothing while
    model_dir does not exist (a checkpoint mode given a wrong one: no directory made for it)."""
    local = storage.local_path(model_dir)
    if not os.environ.get(FILTERED_ENV) or local is None or not os.path.isdir(local):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    path = os.path.join(local, "logs", f"{name}.log")
    os.write(2, _LOG_MARK + path.encode() + b"\n")


def _become_task(pipes: list[tuple[int, int]], parent: int) -> None:
    """The child: output on the pipes, line-buffered; killed if the parent is (kill -9 of the pid
    a user or scheduler knows); a process group of its own, so that a signal to the group
    (Ctrl-C) reaches it once, forwarded by the parent."""
    _die_with_parent(parent)
    os.setpgid(0, 0)
    for (read_end, write_end), target in zip(pipes, (1, 2), strict=True):
        os.close(read_end)
        os.dup2(write_end, target)
        os.close(write_end)
    os.environ[FILTERED_ENV] = "1"
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent dies (Linux' PR_SET_PDEATHSIG); elsewhere the child outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl: nothing would end us
        os._exit(137)


def _serve(pid: int, read_ends: list[int]) -> int:
    """The parent: pumps both streams until the child exits; its exit status, as a shell gives it."""
    log = _PendingLog()
    for signum in _FORWARDED:
        signal.signal(signum, lambda signum, _frame: _forward(pid, signum))
    pumps = [
        threading.Thread(target=_pump, args=(read_end, target, log), daemon=True)
        for read_end, target in zip(read_ends, (1, 2), strict=True)
    ]
    for pump in pumps:
        pump.start()
    _, status = os.waitpid(pid, 0)
    for pump in pumps:
        pump.join(timeout=_DRAIN_S)
    log.close()
    if os.WIFSIGNALED(status):  # die of the same signal, as if we were the task
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    return os.waitstatus_to_exitcode(status)


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _pump(read_end: int, target: int, log: _PendingLog) -> None:
    """Every line to the log, the lines ConsoleFilter keeps to `target`, as they come, in the
    launcher's short format (absl's header cut to the time: the log keeps it whole)."""
    shown: Callable[[str], bool] = console.ConsoleFilter()
    with os.fdopen(read_end, "rb") as pipe:
        for raw in pipe:
            if raw.startswith(_LOG_MARK):
                log.open(raw[len(_LOG_MARK) :].rstrip(b"\n").decode())
                continue
            log.write(raw)
            line = raw.decode(errors="replace").rstrip("\n")
            if shown(console.strip_role(line)):
                short = console.short_line(line)
                _write_all(target, raw if short == line else f"{short}\n".encode())


def _write_all(target: int, data: bytes) -> None:
    with contextlib.suppress(
        OSError
    ):  # a closed console (a pipe whose reader left) must not stop the task
        while data:
            data = data[os.write(target, data) :]


class _PendingLog:
    """The task's log: lines are held until the task says where the log goes (`open`), then
    written there with everything after; never opened, they are dropped with the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[bytes] = []
        self._copy: storage.LogCopy | None = None
        self._failed = False

    def open(self, path: str) -> None:
        with self._lock:
            try:
                local = storage.local_path(path)
                os.makedirs(os.path.dirname(local), mode=0o700, exist_ok=True)
                self._copy = storage.LogCopy(path)
                for raw in self._held:
                    self._copy.write(raw)
            except OSError as e:
                self._failed = True
                _write_all(2, f"[tfdist-train] cannot write {path} ({e}); no log kept\n".encode())
            self._held = []

    def write(self, raw: bytes) -> None:
        with self._lock:
            if self._copy is not None:
                try:
                    self._copy.write(raw)
                except OSError:
                    self._copy = None
            elif not self._failed:
                self._held.append(raw)

    def close(self) -> None:
        with self._lock:
            if self._copy is not None:
                with contextlib.suppress(OSError):
                    self._copy.close()
