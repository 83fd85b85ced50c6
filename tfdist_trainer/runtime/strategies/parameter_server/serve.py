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

    The loop has the evaluator side-car's shape: build, then one named step per turn.
    """
    task = ServingTask(
        cluster,
        model_dir,
        chief_gone_grace_s=chief_gone_grace_s,
        preemption_grace_s=preemption_grace_s,
    )
    while True:
        task.look_for_the_chief()
        if task.training_done():
            task.finish()
            return
        if task.termination.received:
            task.leave_on_sigterm()
            return
        task.give_up_on_a_lost_chief()
        task.wait(poll_s)


class ServingTask:
    """A serving task, built: its servers started, its SIGTERM handler, what it knows of the chief."""

    def __init__(
        self,
        cluster: ClusterConfig,
        model_dir: str,
        *,
        chief_gone_grace_s: float,
        preemption_grace_s: float,
    ):
        self.cluster, self.model_dir = cluster, model_dir
        self.chief_gone_grace_s, self.preemption_grace_s = chief_gone_grace_s, preemption_grace_s
        self.stale = markers.done_run_id(model_dir)  # a marker already there is an older run's
        self.servers = data_service.start_servers(cluster, model_dir)
        if cluster.task_type != DISPATCHER:
            server = tf.distribute.Server(
                tf.train.ClusterSpec(cluster.training_cluster()),
                job_name=cluster.task_type,
                task_index=cluster.task_id,
                protocol=cluster.rpc_layer,
                start=True,
            )
            self.servers.append(server)
            logging.info("serving at %s", server.target)
        self.is_ps = cluster.task_type == PS
        # A worker leaves at once and says so in one line; a ps says that it holds its exit.
        self.termination = preemption.TerminationSignal(
            f"serving on until the chief has saved a checkpoint of this task's variables (at most "
            f"{preemption_grace_s:g}s, --preemption_grace_s)"
            if self.is_ps
            else None
        )
        self.chief = cluster.tasks((CHIEF,))[0]
        self.chief_up = self.seen = False
        self.gone_since: float | None = None
        self.last_note = time.monotonic()

    def look_for_the_chief(self) -> None:
        """Is the chief listening? Said once when it first is."""
        self.chief_up = is_listening(self.chief, timeout=1.0)
        if self.chief_up:
            if not self.seen:
                logging.info("chief %s is up", self.chief.address)
            self.seen, self.gone_since = True, None

    def training_done(self) -> bool:
        """The chief of this run (seen up) marked training done."""
        return self.seen and markers.done_since(self.model_dir, self.stale)

    def finish(self) -> None:
        logging.info("the chief marked training done: exiting after it")
        # after the chief (its exit releases functions on this task); ps:0, the leader, last
        shutdown.finish_serving(self.cluster)

    def leave_on_sigterm(self) -> None:
        """A SIGTERM came: leave now (no chief, or a worker), or once the chief saved this ps."""
        if not self.chief_up:  # the job is being torn down (or was never up): nothing to keep
            logging.info("stopped by SIGTERM while no chief runs: exiting")
            logging.flush()
            # No interpreter shutdown under a running TF server (see cli: it can crash).
            os._exit(Preempted.exit_code)
        if not self.is_ps:
            raise Preempted(
                f"stopped by SIGTERM: the job goes on without this worker (the chief runs its "
                f"unfinished step loops on the others); exiting with code {Preempted.exit_code} "
                f"(retryable)."
            )
        preemption.hold_ps_until_saved(
            self.cluster,
            self.model_dir,
            grace_s=self.preemption_grace_s,
            done=lambda: markers.done_since(self.model_dir, self.stale),  # the chief is up: seen
        )
        logging.info("the chief marked training done: exiting")

    def give_up_on_a_lost_chief(self) -> None:
        """Raises ChiefLost once a chief seen up has been unreachable for chief_gone_grace_s;
        a chief not yet up is waited for, said every 30 s."""
        now = time.monotonic()
        if not self.chief_up and self.seen:
            self.gone_since = self.gone_since or now
            gone_s = now - self.gone_since
            if self.chief_gone_grace_s > 0 and gone_s >= self.chief_gone_grace_s:
                raise ChiefLost(
                    f"the chief at {self.chief.address} has been unreachable for {gone_s:.0f}s "
                    f"(--chief_gone_grace_s={self.chief_gone_grace_s:g}) and never marked "
                    f"training done; exiting with code {ChiefLost.exit_code} (retryable) so that "
                    f"a restart policy brings this task back for the restarted chief."
                )
        elif not self.chief_up and now - self.last_note > 30:
            logging.info("waiting for the chief at %s", self.chief.address)
            self.last_note = now

    def wait(self, poll_s: float) -> None:
        preemption.sleep_unless(lambda: self.termination.received, poll_s)
