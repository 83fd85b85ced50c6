"""Preemption: what each task does on SIGTERM, so that a preempted task costs at most the current loop.

A cluster preempts a task with SIGTERM, then SIGKILL after a grace period
(Kubernetes: the pod's ``terminationGracePeriodSeconds``, 30 s by default).

* **A training task** (the chief, a lone process, every multi_worker_mirrored
  worker) finishes its current loop, saves a checkpoint and exits 143
  (tfdist_trainer.runtime.train.task_hooks). The loop is one `tf.function`
  call of steps_per_loop steps (the parameter_server chief: the batch of
  closures in flight), not the stretch to the next log record: the step loop
  asks between its calls (`task_hooks.between_loops`).
* **A ps** (parameter_server) holds the variables, so its exit would lose
  every step since the last periodic checkpoint. It keeps serving and asks
  the chief to save (`markers.request_save`: ``preempted-ps-<i>`` in
  model_dir). The chief, which looks between batches of closures
  (`PsSaveRequests`), saves once the batch in flight has finished, answers (``preemption_saved``, with the
  step) and exits 143; the ps exits 143 once it reads the answer, at once
  when no chief is running, or after its grace (``--preemption_grace_s``).
* **A parameter_server worker** leaves at once (exit 143): the coordinator
  re-runs its unfinished loops on the other workers, as for a lost worker.
* **The evaluator** stops after its current evaluation and exits 143; the
  training does not notice, and a restart goes on after the step it evaluated.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from absl import logging

from tfdist_trainer.errors import EXIT_PREEMPTED, Preempted
from tfdist_trainer.io import markers
from tfdist_trainer.plan.cluster import CHIEF, ClusterConfig
from tfdist_trainer.plan.network import is_listening

#: How often the chief reads model_dir for a ps's save request (one small listing each time).
REQUEST_POLL_S = 1.0


class TerminationSignal:
    """Remembers a SIGTERM so the task can stop in order at its next check; says `message` (if any) once."""

    def __init__(self, message: str | None = None):
        self.received = False
        self._message = message
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        if not self.received and self._message:
            logging.warning("SIGTERM received: %s", self._message)
        self.received = True


def stop_quietly_on_sigterm(doing: str) -> None:
    """Until a task installs its TerminationSignal: SIGTERM ends it at once with one line, exit 143.

    For the evaluator, whose start (TensorFlow, the model, the eval data) takes
    a while on a busy machine: there is nothing to save yet, no traceback is
    worth printing, and 143 (preempted) lets a restart policy bring it back
    while training goes on without it.
    """

    def handle(signum, frame):
        logging.error(
            "stopped by SIGTERM while %s; training goes on without it: exiting with code %d",
            doing,
            EXIT_PREEMPTED,
        )
        raise SystemExit(EXIT_PREEMPTED)

    signal.signal(signal.SIGTERM, handle)


class PsSaveRequests:
    """The parameter_server chief's view of the ps tasks' save requests, read at most every `poll_s`."""

    def __init__(
        self,
        model_dir: str,
        *,
        poll_s: float = REQUEST_POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model_dir = model_dir
        self._poll_s = poll_s
        self._clock = clock
        self._next_read = 0.0
        markers.clear_save_requests(model_dir)  # an earlier run's: its ps tasks are gone

    def pending(self, *, now: bool = False) -> list[dict]:
        """The requests in model_dir; [] between reads unless `now`."""
        if not now and self._clock() < self._next_read:
            return []
        self._next_read = self._clock() + self._poll_s
        return markers.save_requests(self.model_dir)

    def answer(self, requests: list[dict], step: int) -> None:
        if requests:
            markers.answer_save_requests(self.model_dir, requests, step)


def preempted_ps_text(requests: list[dict]) -> str:
    tasks = sorted({r["task"] for r in requests})
    return f"{', '.join(tasks)} {'was' if len(tasks) == 1 else 'were'} preempted (SIGTERM)"


def hold_ps_until_saved(
    cluster: ClusterConfig,
    model_dir: str,
    *,
    grace_s: float,
    done: Callable[[], bool],
    poll_s: float = 0.2,
) -> None:
    """A preempted ps serves on until the chief has saved its variables; returns only when training is done.

    Raises Preempted (exit 143) once the chief's answer names this task's
    request, as soon as the chief is gone (no save can come), or after
    `grace_s` without an answer.
    """
    role = cluster.role
    request_id = markers.request_save(model_dir, role)
    chief = cluster.tasks((CHIEF,))[0]
    deadline = time.monotonic() + grace_s
    while True:
        if done():
            return
        step = markers.saved_step(model_dir, request_id)
        if step is not None:
            raise Preempted(
                f"stopped by SIGTERM after the chief saved this task's variables in a checkpoint at "
                f"step {step}; exiting with code {Preempted.exit_code} (retryable)."
            )
        if not is_listening(chief, timeout=1.0):
            raise Preempted(
                f"stopped by SIGTERM; the chief at {chief.address} stopped without saving this "
                f"task's variables: the job resumes from its last checkpoint; exiting with code "
                f"{Preempted.exit_code} (retryable)."
            )
        if time.monotonic() >= deadline:
            raise Preempted(
                f"stopped by SIGTERM; the chief saved no checkpoint within {grace_s:g}s "
                f"(--preemption_grace_s): the job resumes from its last checkpoint; exiting with "
                f"code {Preempted.exit_code} (retryable)."
            )
        time.sleep(poll_s)


def sleep_unless(stop: Callable[[], bool], seconds: float, slice_s: float = 0.1) -> None:
    """Sleeps `seconds`, waking early once `stop()` is true (a SIGTERM does not cut a sleep short)."""
    deadline = time.monotonic() + seconds
    while not stop() and time.monotonic() < deadline:
        time.sleep(min(slice_s, max(0.0, deadline - time.monotonic())))
