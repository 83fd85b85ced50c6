"""An orderly end of a successful job: the coordination service's leader exits last.

TensorFlow runs a coordination service in one task of a multi-process job (the
chief or worker:0 under multi_worker_mirrored, ps:0 under parameter_server);
every other coordinated task sends it heartbeats. A task that outlives the
leader logs gRPC `UNAVAILABLE ... Heartbeat ... Connection refused` errors at
its next heartbeat, although the job succeeded. So after training:

* under multi_worker_mirrored every coordinated task first meets the others at
  a coordination-service barrier (`finish_synchronous_job`): no task leaves
  while another still trains or runs its hooks' `end`;
* the other tasks then exit, and the leader waits, at most
  `LEADER_WAIT_S`, until their gRPC ports close (`wait_until_gone`), that is
  until their processes are gone, before it exits itself.

Under parameter_server the chief, which drives the workers and ps, has one more
thing to do after it marked training done: at its exit TensorFlow releases every
function the chief registered on each worker and ps, one RPC per function and
task. A task already gone turns each into an error line on the chief ("Failed to
remove function remotely due to Socket closed"; hundreds with 2 ps). So the
serving tasks leave after the chief (`finish_serving`), ps:0 last.

A training task asks its strategy's `finish_job` (`StrategyRuntime`), which calls
`finish_synchronous_job`; parameter_server's `serve` calls `finish_serving`.

Failures keep their own paths: this only runs after training returned
normally, and a barrier that fails (a peer died after its last step) is
logged and skipped, never turned into an error of a job that finished.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.plan.cluster import CHIEF, PS, WORKER, ClusterConfig, TaskAddress
from tfdist_trainer.plan.network import is_listening

#: How long the leader waits for the other tasks' processes to be gone.
LEADER_WAIT_S = 30.0
#: How long a parameter_server worker or ps, after training is done, waits for the chief to exit.
CHIEF_EXIT_WAIT_S = 30.0
#: How long a task waits at the final barrier for the slowest task to finish its hooks.
BARRIER_TIMEOUT_S = 600.0
BARRIER_ID = "tfdist_trainer_training_done"

_LEADER = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def wait_until_gone(tasks: Sequence[TaskAddress], timeout_s: float = LEADER_WAIT_S) -> list[str]:
    """Polls the tasks' ports until none listens or `timeout_s` passes; returns the tasks still up."""
    deadline = time.monotonic() + timeout_s
    left = list(tasks)
    while left:
        left = [t for t in left if is_listening(t, timeout=0.5)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return [t.name for t in left]


def _coordination() -> tuple[tuple[str, int], list[str]] | None:
    """The coordination service's leader and coordinated jobs in this process, if it runs one."""
    config = tf_compat.coordination_service_config()
    if config is None or not config.service_type or not config.service_leader:
        return None
    match = _LEADER.search(config.service_leader)
    if match is None:
        return None
    jobs = [job.name for job in config.coordinated_job_list]
    return (match.group(1), int(match.group(2))), jobs


def finish_synchronous_job(cluster: ClusterConfig) -> None:
    """After training succeeded under a coordination service (multi_worker_mirrored): leave in order."""
    if cluster.is_local or cluster.task_type is None:
        return
    found = _coordination()
    if found is None:
        return
    (leader_type, leader_id), jobs = found
    if cluster.task_type not in jobs:
        return
    import tensorflow as tf

    try:
        tf_compat.wait_at_barrier(BARRIER_ID, BARRIER_TIMEOUT_S)
    except tf.errors.OpError as e:
        logging.warning(
            "training finished, but not every task reached the final barrier (%s: %s); exiting anyway",
            type(e).__name__,
            " ".join((e.message or "").split())[:300],
        )
        return
    if (cluster.task_type, cluster.task_id) != (leader_type, leader_id):
        return
    others = [
        t
        for t in cluster.tasks(jobs)
        if (t.task_type, t.task_id) != (cluster.task_type, cluster.task_id)
    ]
    _leader_waits(others)


def finish_serving(cluster: ClusterConfig) -> None:
    """A parameter_server task done serving: it waits for the chief to exit (at most
    `CHIEF_EXIT_WAIT_S`), and ps:0, the coordination leader, then for the workers and ps."""
    chief = cluster.tasks((CHIEF,))
    if chief:
        start = time.monotonic()
        if wait_until_gone(chief, CHIEF_EXIT_WAIT_S):
            logging.info("exiting although the chief still listens after %.0fs", CHIEF_EXIT_WAIT_S)
        else:
            logging.info("the chief exited (%.1fs)", time.monotonic() - start)
    if cluster.task_type != PS or cluster.task_id != 0:
        return
    others = [t for t in cluster.tasks((WORKER, PS)) if (t.task_type, t.task_id) != (PS, 0)]
    _leader_waits(others)


def _leader_waits(others: Sequence[TaskAddress]) -> None:
    if not others:
        return
    start = time.monotonic()
    left = wait_until_gone(others)
    if left:
        logging.info(
            "exiting although %s still listen(s) after %.0fs", ", ".join(left), LEADER_WAIT_S
        )
    else:
        logging.info(
            "the other tasks exited (%.1fs): exiting last, as the coordination leader",
            time.monotonic() - start,
        )
