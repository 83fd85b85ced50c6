"""A task that tfdist-launch started ends when the launcher is gone.

Each task runs in its own session (so that a signal to one task never reaches
another), which also means a launcher killed by SIGKILL, the OOM killer or a
closed terminal leaves its tasks running: parameter servers that serve forever,
workers that hold ports and cores. The launcher names itself in the task's
environment; the task checks once a second that the launcher is still its
parent and, when it is not, stops the way the launcher would have stopped it:
SIGTERM (a chief saves, an evaluator stops quietly), then SIGKILL after the
grace period. Tasks started any other way (Kubernetes, by hand) are not watched.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping

from absl import logging

LAUNCHER_PID_ENV = "TFDIST_LAUNCHER_PID"
GRACE_ENV = "TFDIST_LAUNCHER_GRACE_S"
_POLL_S = 1.0


def environment(grace_s: float) -> dict[str, str]:
    """What the launcher adds to a task's environment so that the task ends with it."""
    return {LAUNCHER_PID_ENV: str(os.getpid()), GRACE_ENV: f"{grace_s:g}"}


def end_with_launcher(environ: Mapping[str, str] = os.environ) -> None:
    """Starts the watch if a launcher started this process; returns at once."""
    launcher = environ.get(LAUNCHER_PID_ENV)
    if not launcher:
        return
    grace_s = float(environ.get(GRACE_ENV, "10"))
    thread = threading.Thread(
        target=_watch, args=(int(launcher), grace_s), name="launcher-watch", daemon=True
    )
    thread.start()


def _watch(launcher_pid: int, grace_s: float) -> None:
    while os.getppid() == launcher_pid:
        time.sleep(_POLL_S)
    logging.warning(
        "tfdist-launch (pid %d) is gone; this task stops (SIGTERM, SIGKILL after %gs)",
        launcher_pid,
        grace_s,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)
