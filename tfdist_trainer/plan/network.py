"""The network a task's cluster lives on, probed before TensorFlow starts.

TensorFlow's own errors here are poor: a port in use gives "Could not start
gRPC server" without the port, a peer that never starts makes a task wait
forever. So a task checks its own port, holds it while it waits, and waits for
its peers with a deadline, each failure one sentence naming the task and the fix.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Sequence

from tfdist_trainer.errors import ClusterConfigError
from tfdist_trainer.plan.cluster import ClusterConfig, TaskAddress


def port_is_free(port: int) -> bool:
    """Whether a TF server could listen on ``port`` (it binds 0.0.0.0 whatever the host says)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def check_own_port(config: ClusterConfig) -> None:
    """Names the port when it is taken; TF would only say 'Could not start gRPC server'."""
    own = config.own_address
    if own is not None and not port_is_free(own.port):
        raise ClusterConfigError(
            f"port {own.port} of {own.name} ({own.address}) is already in use; stop the process "
            f"holding it or give this task another port."
        )


def is_listening(address: TaskAddress, timeout: float = 1.0) -> bool:
    """Whether a process accepts connections at `address`.

    A probe of a local port in the kernel's ephemeral range can be given that very
    port as its source and connect to itself (TCP simultaneous open); that is
    nobody listening, and the probe must not hold the port the task is about to bind.
    """
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout) as s:
            return s.getsockname() != s.getpeername()
    except OSError:
        return False


class PortHolder:
    """Listens on this task's port until TF takes it, so that peers can see us while we wait for them.

    Multi-worker tasks wait for each other before starting TF; without a
    listener each would wait for the other forever.
    """

    def __init__(self, port: int):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("", port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def wait_for_tasks(
    tasks: Sequence[TaskAddress], *, timeout_s: float, poll_s: float = 0.25, waiting_for: str = ""
) -> None:
    """Blocks until every task accepts TCP connections, or names those that never did."""
    pending = list(tasks)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = [t for t in pending if not is_listening(t, timeout=min(1.0, poll_s * 4))]
        if not pending:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(f"{t.name} at {t.address}" for t in pending)
            raise ClusterConfigError(
                f"{names} never answered within {timeout_s:g}s{waiting_for}; start "
                f"{'that task' if len(pending) == 1 else 'those tasks'} or fix the cluster addresses."
            )
        time.sleep(poll_s)


def set_grpc_environment(environ: dict = os.environ) -> None:
    """Makes RPCs to a dead peer fail instead of hanging (DESIGN: GRPC_FAIL_FAST)."""
    environ.setdefault("GRPC_FAIL_FAST", "use_caller")
