"""A ps, worker or tf.data dispatcher task under parameter_server: serve until the chief marks training done."""

from __future__ import annotations

import os
import time

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import ChiefLost, Preempted
from tfdist_trainer.io import markers
from tfdist_trainer.plan.cluster import CHIEF, DISPATCHER, PS, ClusterConfig
from tfdist_trainer.plan.network import is_listening
from tfdist_trainer.runtime import preemption, shutdown
from tfdist_trainer.runtime.strategies.parameter_server import data_service


def serve(
    cluster: ClusterConfig,
    model_dir: str,
    *,
    chief_gone_grace_s: float,
    preemption_grace_s: float,
    poll_s: float = 1.0,
) -> None:
    """Runs this task's TF server until the chief marks training done in model_dir, then returns (exit 0).

    A chief that has been unreachable for `chief_gone_grace_s` (0: wait
    forever; a restarted chief comes back well within the default) raises
    ChiefLost: the job did not finish, so the task exits with a retryable code
    rather than 0, and Kubernetes or a launcher restarts it. Without this, ps
    and worker processes started by hand would outlive the job forever.

    On SIGTERM (a preemption) a worker leaves at once, since the coordinator
    re-runs its loops on the other workers; a ps serves on until the chief has
    saved its variables, at most `preemption_grace_s`
    (tfdist_trainer.runtime.preemption). Both raise Preempted (exit 143).
    """
    stale = markers.done_run_id(model_dir)  # a marker already there is an older run's
    servers = data_service.start_servers(cluster, model_dir)
    if cluster.task_type != DISPATCHER:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cluster.training_cluster()),
            job_name=cluster.task_type,
            task_index=cluster.task_id,
            protocol=cluster.rpc_layer,
            start=True,
        )
        servers.append(server)
        logging.info("serving at %s", server.target)
    is_ps = cluster.task_type == PS
    # A worker leaves at once and says so in one line (below); a ps says that it holds its exit.
    termination = preemption.TerminationSignal(
        f"serving on until the chief has saved a checkpoint of this task's variables (at most "
        f"{preemption_grace_s:g}s, --preemption_grace_s)"
        if is_ps
        else None
    )
    chief = cluster.tasks((CHIEF,))[0]
    seen, gone_since, last_note = False, None, time.monotonic()
    while True:
        up = is_listening(chief, timeout=1.0)
        now = time.monotonic()
        if up:
            if not seen:
                logging.info("chief %s is up", chief.address)
            seen, gone_since = True, None
        if seen and markers.done_since(model_dir, stale):
            logging.info("the chief marked training done: exiting after it")
            # after the chief (its exit releases functions on this task); ps:0, the leader, last
            shutdown.finish_serving(cluster)
            return
        if termination.received:
            if (
                not up
            ):  # the job is being torn down (or was never up): nothing to keep, nothing to say
                logging.info("stopped by SIGTERM while no chief runs: exiting")
                logging.flush()
                # No interpreter shutdown under a running TF server (see cli: it can crash).
                os._exit(Preempted.exit_code)
            if not is_ps:
                raise Preempted(
                    f"stopped by SIGTERM: the job goes on without this worker (the chief runs its "
                    f"unfinished step loops on the others); exiting with code {Preempted.exit_code} "
                    f"(retryable)."
                )
            preemption.hold_ps_until_saved(
                cluster,
                model_dir,
                grace_s=preemption_grace_s,
                done=lambda: markers.done_since(model_dir, stale),  # the chief is up: seen
            )
            logging.info("the chief marked training done: exiting")
            return
        if not up and seen:
            gone_since = gone_since or now
            if chief_gone_grace_s > 0 and now - gone_since >= chief_gone_grace_s:
                raise ChiefLost(
                    f"the chief at {chief.address} has been unreachable for {now - gone_since:.0f}s "
                    f"(--chief_gone_grace_s={chief_gone_grace_s:g}) and never marked training done; "
                    f"exiting with code {ChiefLost.exit_code} (retryable) so that a restart policy "
                    f"brings this task back for the restarted chief."
                )
        elif not up and now - last_note > 30:
            logging.info("waiting for the chief at %s", chief.address)
            last_note = now
        preemption.sleep_unless(lambda: termination.received, poll_s)
