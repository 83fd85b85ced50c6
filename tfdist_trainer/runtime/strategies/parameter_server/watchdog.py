"""The parameter_server chief's watchdog: a stalled cluster becomes a clear, retryable error.

TensorFlow's gRPC channels have no keepalive. When a worker's link goes down
for good (no packets, no reset), the closure in flight on it never finishes
and never fails, and `ClusterCoordinator.join()` waits forever: the job
hangs silently. The watchdog waits for the scheduled closures itself; when
none has finished for `timeout_s`, it raises `ClusterStalledError` naming the
workers whose closure is stuck, and the controller saves a checkpoint and exits
with a retryable code, so that a restart policy resumes the job.

Which worker holds a closure, and whether a closure has finished, are not
public in TF 2.21: tfdist_trainer.tf_compat reads them (and
tests/test_tf_compat.py fails loudly when an upgrade changes either).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ClusterStalledError


def wait_for_closures(
    coordinator: Any,
    remote_values: Sequence[Any],
    *,
    timeout_s: float,
    worker_addresses: Sequence[str] = (),
    poll_s: float = 1.0,
) -> None:
    """Like `coordinator.join()`, but raises ClusterStalledError after `timeout_s` without progress.

    `join()` runs in a helper thread, so the caller wakes the moment the last
    closure finishes (no polling delay on the hot path) and errors from the
    closures are raised here exactly as `join()` raises them. `timeout_s <= 0`
    is a plain `join()`.
    """
    if timeout_s <= 0:
        coordinator.join()
        return
    outcome: list[BaseException | None] = []

    def join():
        try:
            coordinator.join()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            outcome.append(e)

    joiner = threading.Thread(target=join, name="tfdist-join", daemon=True)
    joiner.start()
    finished = sum(tf_compat.remote_value_finished(r) for r in remote_values)
    last_progress = time.monotonic()
    while True:
        joiner.join(timeout=min(poll_s, timeout_s))
        if outcome:
            if outcome[0] is not None:
                raise outcome[0]
            return
        now_finished = sum(tf_compat.remote_value_finished(r) for r in remote_values)
        if now_finished > finished:
            finished, last_progress = now_finished, time.monotonic()
        elif time.monotonic() - last_progress >= timeout_s:
            silent = tf_compat.busy_worker_indices()
            names = ", ".join(
                f"worker:{i}" + (f" ({worker_addresses[i]})" if i < len(worker_addresses) else "")
                for i in silent
            )
            raise ClusterStalledError(
                f"no scheduled step loop finished for {timeout_s:g}s; "
                + (
                    f"silent: {names}"
                    if silent
                    else "no worker holds a closure (the coordinator is stuck)"
                )
                + f" ({len(remote_values) - finished} of {len(remote_values)} closures of this round unfinished)",
                silent,
            )
