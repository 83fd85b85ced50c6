"""A parameter_server cluster that stopped answering: save what the finished loops counted, then exit.

`watchdog` raises `ClusterStalledError` when no scheduled closure finished for
`parameter_server.stall_timeout_s`; this turns it into the task's last words (what was
saved, and that a restart resumes), asked by `ParameterServerRuntime.run_loop` with the
task's `FinalSave` (the checkpointer, and a durable save of the finished steps).
"""

from __future__ import annotations

import threading

import tensorflow as tf

from tfdist_trainer.errors import ClusterStalledError
from tfdist_trainer.runtime.checkpoints import FinalSave

#: The longest a chief waits for its last checkpoint after the watchdog fired.
STALL_SAVE_TIMEOUT_S = 60.0


def save_after_stall(final: FinalSave, stalled: ClusterStalledError, timeout_s: float) -> str:
    """Saves what the finished closures counted when the cluster lets it; says what was kept.

    A save needs only the chief and the ps once the chief's traced write exists
    (it is made at the first periodic save). Before that, the save would define
    a new function, and TF registers every new function on every task of the
    cluster, holding the GIL until each has answered: with a silent worker the
    save would hang the chief for good, so none is tried and the restarted
    chief starts again. The save runs in a thread the chief stops waiting for
    after `timeout_s`; a save cut short leaves a ``*_temp`` directory that the
    next start removes.
    """
    kept = final.checkpointer.latest_step()
    kept_text = (
        f"the last checkpoint (step {kept}) is kept"
        if kept is not None
        else "no checkpoint exists yet"
    )
    if stalled.silent and not final.checkpointer.saves_without_the_workers:
        return f"no checkpoint was written (a first save must reach every worker); {kept_text}"
    outcome: list[str] = []

    def save():
        try:
            outcome.append(f"saved a checkpoint at step {final.save()}")  # the chief exits next
        except (tf.errors.OpError, OSError) as e:
            outcome.append(f"no checkpoint could be written ({type(e).__name__}); {kept_text}")

    saver = threading.Thread(target=save, name="tfdist-stall-save", daemon=True)
    saver.start()
    saver.join(timeout_s)
    return (
        outcome[0]
        if outcome
        else f"no checkpoint could be written within {timeout_s:g}s; {kept_text}"
    )


def stalled_error(final: FinalSave, stalled: ClusterStalledError, stall_timeout_s: float):
    """The error the chief exits with after a stall: the watchdog's words, what was saved, what next."""
    saved = save_after_stall(final, stalled, min(STALL_SAVE_TIMEOUT_S, stall_timeout_s))
    return ClusterStalledError(
        f"{stalled}; {saved}; exiting with code {ClusterStalledError.exit_code} (retryable): a restart "
        f"policy (OnFailure or ExitCode) restarts the chief and the ps, which resume from the last "
        f"checkpoint once the workers answer again.",
        stalled.silent,
    )
