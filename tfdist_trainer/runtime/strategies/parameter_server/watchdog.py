"""The parameter_server chief's watchdog: a stalled cluster becomes a clear, retryable error.

TensorFlow's gRPC channels have no keepalive. When a worker's link goes down
for good (no packets, no reset), the closure in flight on it never finishes
and never fails, and `ClusterCoordinator.join()` waits forever (as does a
fetch of a result that lives on that worker): the job hangs silently. The
watchdog fetches the results of a round of closures itself; when none has come
for `timeout_s`, it raises `ClusterStalledError` naming the
workers whose closure is stuck, and the controller saves a checkpoint and exits
with a retryable code, so that a restart policy resumes the job.

Which worker holds a closure is not public in TF 2.21: tfdist_trainer.tf_compat
reads it (and tests/test_tf_compat.py fails loudly when an upgrade changes it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ClusterStalledError
from tfdist_trainer.runtime.checkpoints.failures import one_line


def fetch_result(remote: Any, retry_s: float) -> Any:
    """A closure's result, also when the worker that ran it died before the copy to the chief.

    A finished closure's result lives on its worker until it is copied to the
    chief. TF's own worker thread copies it and, when the worker died, runs the
    closure again on another, meanwhile still offering the old result; a fetch
    of that fails on the dead worker (refused, reset) or on the one restarted
    at its address (which does not know the tensor). Such a fetch is tried
    again until the new result is there; only an error TF settled the closure
    with is raised.
    """
    said = False
    while True:
        try:
            return remote.fetch()
        except tf.errors.OpError as e:
            if tf_compat.remote_value_failure(remote) is not None:
                raise
            if not said:
                logging.info(
                    "a step loop's worker went away before its result reached the chief (%s); "
                    "waiting for the coordinator to run it again",
                    one_line(e),
                )
                said = True
            time.sleep(retry_s)


def fetch_closures(
    coordinator: Any,
    remote_values: Sequence[Any],
    *,
    timeout_s: float,
    worker_addresses: Sequence[str] = (),
    poll_s: float = 1.0,
) -> list:
    """The fetched results of these closures; ClusterStalledError after `timeout_s` without progress.

    Only these: `coordinator.join()` would also wait for the batch queued behind
    them, and the workers would then sit idle while the chief reads the results
    and schedules the next one. A fetch copies a result from its worker, so it
    hangs on a silent link too: results are fetched on a helper thread, one by
    one, and each fetched result is progress. A failed closure's error is raised
    as `join()` raises it (the coordinator's first error, the rest cancelled).
    `timeout_s <= 0` waits without a limit.

    A round that came back whole means every ps answered it: the coordinator's
    count of suspected ps failures starts again (`tf_compat.forgive_transient_ps_failures`),
    so that the errors a restarting worker causes over a long job do not add up
    to a lost ps that ends the chief.
    """
    fetched: list = []
    failure: list[BaseException] = []

    def fetch_all():
        try:
            for remote in remote_values:
                fetched.append(fetch_result(remote, poll_s))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            failure.append(e)

    fetcher = threading.Thread(target=fetch_all, name="tfdist-fetch", daemon=True)
    fetcher.start()
    progress, last_progress = 0, time.monotonic()
    while True:
        fetcher.join(timeout=min(poll_s, timeout_s) if timeout_s > 0 else None)
        if failure:
            coordinator.join()  # raises the closure's error as it always did, cancels the rest
            raise failure[0]
        if not fetcher.is_alive():
            tf_compat.forgive_transient_ps_failures(coordinator)
            return fetched
        if len(fetched) > progress:
            progress, last_progress = len(fetched), time.monotonic()
        elif timeout_s > 0 and time.monotonic() - last_progress >= timeout_s:
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
                + f" ({len(remote_values) - len(fetched)} of {len(remote_values)} closures of this "
                "round unfinished)",
                silent,
            )
