"""The training task's own protocols, as hooks that run after the user's hooks.

`build_run` appends them, in this order, after `train.extra_hooks` and the
default hooks, so a user's hook always sees a loop before the task acts on it:

1. `RunFiles`: begin clears the done marker (a restarted chief's side-cars keep
   following) and writes ``config.gin``; end waits for the last checkpoint to be
   durable, writes ``operative_config.gin`` and marks the run done at its final step.
2. `StopWhenDataEnds`: a finite dataset read through the tf.data service ends
   training once every worker's reader found no more data.
3. `SaveOnPreemption`: on SIGTERM (agreed by every synchronous worker), or when
   a preempted ps asks the chief to save its variables, save after this loop and
   wait until the save is durable, answer the ps, and exit 143 (retryable). One
   save answers both. The step loop asks it between its calls too
   (`between_loops`), so "this loop" is one
   `tf.function` call (parameter_server: at most two batches of closures), never the
   whole stretch to the next log record.

tests/unit/test_task_hooks.py checks the order and each hook's effect.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import gin

from tfdist_trainer.errors import Preempted
from tfdist_trainer.hooks import Hook, StopTraining
from tfdist_trainer.io import markers, storage
from tfdist_trainer.runtime import preemption
from tfdist_trainer.runtime.train.run_context import RunContext


class RunFiles(Hook):
    """The chief's files about the run itself: the config it ran with and whether it is done."""

    def begin(self, run: RunContext) -> None:
        if not run.cluster.is_chief:
            return
        markers.clear_done(run.model_dir)
        command = " ".join(sys.argv)
        config = gin.config_str()
        storage.write_text(
            storage.join(run.model_dir, "config.gin"), f"# command: {command}\n{config}"
        )
        run.summaries.text("train", "config", f"command: `{command}`\n\n```\n{config}\n```")

    def end(self, run: RunContext) -> None:
        # The last checkpoint is complete before the marker says done: the evaluator exits once
        # it has evaluated the marked step, and a launcher reads the run as finished.
        run.wait_for_checkpoints()
        # After training, gin knows which bindings were really used: save those too.
        if not run.cluster.is_chief:
            return
        storage.write_text(
            storage.join(run.model_dir, "operative_config.gin"), gin.operative_config_str()
        )
        markers.mark_done(run.model_dir, run.step)


class StopWhenDataEnds(Hook):
    """A finite dataset served by the tf.data service ends training when its epoch is read."""

    def after_loop(self, run, result):
        if result.data_ended:
            raise StopTraining(
                f"the training data ended at step {run.step}: every example of the epoch was "
                f"read (parameter_server.data_service)"
            )


class SaveOnPreemption(Hook):
    """SIGTERM, or a preempted ps's save request: save after the current loop, then exit 143.

    The step loop asks `requested` between its calls (`between_loops`), so the
    save follows the loop that was running, not the next hook stop (which may
    be a log interval of minutes away); `after_loop` asks it once more.
    """

    def __init__(self, model_dir: str, *, answers_ps: bool):
        self.termination = preemption.TerminationSignal(
            "saving a checkpoint after the current loop, then exiting"
        )
        # A preempted ps asks the chief to save the variables it holds before it exits.
        self.ps_requests = preemption.PsSaveRequests(model_dir) if answers_ps else None
        self._signalled = False
        self._requests: list[dict] = []

    def requested(self, run: RunContext) -> bool:
        """Whether to save and stop now: this task's SIGTERM (on any synchronous worker: they
        agree, one collective) or a ps's request (model_dir read at most once a second).

        A yes is kept: the loop that stops on it and the `after_loop` that saves must see the
        same requests (a second read within the second would find none), and every
        synchronous worker, having agreed, skips the next agreement alike.
        """
        if not (self._signalled or self._requests):
            self._signalled = run.agree(self.termination.received)
            if self.ps_requests:
                self._requests = self.ps_requests.pending(now=self._signalled)
        return self._signalled or bool(self._requests)

    def after_loop(self, run, result):
        if not self.requested(run):
            return
        # Durable before the ps is answered (it exits on the answer) and before this task exits.
        run.save_checkpoint(durable=True)
        if self.ps_requests:
            self.ps_requests.answer(self._requests, run.step)
        if self._signalled:
            raise Preempted(
                f"stopped by SIGTERM at step {run.step} after saving a checkpoint; "
                f"run the same command again to resume."
            )
        raise Preempted(
            f"{preemption.preempted_ps_text(self._requests)}: stopped at step {run.step} after "
            f"saving a checkpoint of its variables; exiting with code {Preempted.exit_code} "
            f"(retryable): run the same command again (or let a restart policy restart the "
            f"chief and the ps) to resume."
        )


def task_hooks(run: RunContext, *, answers_ps: bool) -> list[Hook]:
    """The task's hooks, in the order they run after the user's (see the module docstring);
    `answers_ps`: the strategy's `answers_ps_save_requests` (parameter_server's chief)."""
    return [
        RunFiles(),
        StopWhenDataEnds(),
        SaveOnPreemption(run.model_dir, answers_ps=answers_ps),
    ]


def between_loops(run: RunContext, hooks: Sequence[Hook]) -> Callable[[], bool]:
    """What the step loop asks between its calls: whether a task hook must act before the next
    hook stop (`SaveOnPreemption`: a SIGTERM or a ps's save request), so it returns early."""
    urgent = [h for h in hooks if isinstance(h, SaveOnPreemption)]
    return lambda: any(h.requested(run) for h in urgent)
