"""Checkpointer: one task's checkpoints: restore at start, `save(step)`, `wait()`.

What a training task holds for its checkpoints. It restores (`restore`) and
forwards saves to its writer (`writer`); the training task asks for every save
through one method (`RunContext.save_checkpoint`), so the checkpointer's
contract below is all a caller relies on, and a writer that returns before
its files are written (an asynchronous one) changes only `writer`.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.io import storage
from tfdist_trainer.io.checkpoint_names import step_of
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.runtime.checkpoints import restore as restoring
from tfdist_trainer.runtime.checkpoints.background_writer import BackgroundWriter
from tfdist_trainer.runtime.checkpoints.listing import Location
from tfdist_trainer.runtime.checkpoints.writer import SyncWriter

#: A synchronous peer's throw-away checkpoint directory in model_dir: this, then its role.
PEER_DIRECTORY_PREFIX = ".tmp_checkpoints-"


class Checkpointer:
    """Owns the checkpoints of one task: restore, save, wait."""

    def __init__(
        self,
        *,
        model_dir: str,
        cluster: ClusterConfig,
        checkpoint: tf.train.Checkpoint,
        global_step: tf.Variable,
        keep: int,
        spans_tasks: bool = False,
        is_writer: bool | None = None,
        background: bool = False,
    ):
        """`spans_tasks`: the variables live on other tasks (parameter_server; `writer`'s doc);
        `is_writer`: this task's checkpoints are the run's (`StrategyRuntime.keeps_checkpoints`;
        default: the chief's), else a throw-away copy; `background`: `save` copies the state
        and a thread writes it (`background_writer`; only where no other worker takes part in
        a save, `train.async_checkpoint`)."""
        self.model_dir = model_dir
        self.is_writer = cluster.is_chief if is_writer is None else is_writer
        self.global_step = global_step
        self._checkpoint = checkpoint
        self._where = Location(
            model_dir=model_dir,
            directory=(
                model_dir
                if self.is_writer
                else storage.join(model_dir, PEER_DIRECTORY_PREFIX + cluster.role.replace(":", "-"))
            ),
            is_writer=self.is_writer,
        )
        writer = BackgroundWriter if background and self.is_writer else SyncWriter
        self._writer = writer(
            checkpoint,
            self._where,
            keep=keep,
            spans_tasks=spans_tasks,
            # Alone, an unanswered write can only be the storage's; in a cluster it may be a lost peer.
            alone=cluster.is_local and not spans_tasks,
        )

    def restore(self) -> int | None:
        """Restores the chief's newest readable checkpoint; returns its step, or None when fresh
        (`restore.restore`: damaged newer ones are skipped, and the chief sets them aside)."""
        self._writer.wait()  # a save in flight (NanGuard restores mid-run) is listed first
        step = restoring.restore(self._checkpoint, self.global_step, self._where)
        if step is not None:
            self._writer.last_saved_step = step
        self._writer.ready()
        return step

    @property
    def saves_without_the_workers(self) -> bool:
        """True once a save needs only this task and the ps: the traced write exists (`writer`)."""
        return self._writer.write_traced

    def latest_step(self) -> int | None:
        """The step of the chief's latest durable checkpoint, without restoring it (a save in
        flight is not waited for: the stall save asks this of a cluster that may not answer)."""
        latest = tf.train.latest_checkpoint(self.model_dir)
        return step_of(latest) if latest else None

    def save(self, step: int) -> None:
        """Saves checkpoint ``ckpt-<step>`` of the state as it is now; a second save of the same
        step does nothing.

        Durable: the files are complete on storage and listed in model_dir's ``checkpoint``
        file (what every reader follows) once `wait()` has returned. A checkpoint is listed
        only when its files are complete, so no reader ever sees a half-written one. The
        background writer returns once the small state is copied and writes on a thread (the
        synchronous one returns durable); a caller calls `wait()` before it needs the files
        (an export from them, the done marker, an exit). The state may change as soon as
        `save` returns.

        What a checkpoint of step N holds. A synchronous save: the state after step N. A
        background save, while training goes on: the step counter and everything that is not
        a table (dense weights and their optimizer slots, optimizer scalars such as the
        iteration count) exactly as after step N, copied before `save` returns; each table
        part (a saved slice of a sharded table or of its optimizer slot: a "div" shard or a
        64 MiB "mod" chunk; a dynamic table's keys and rows) as it was when the write read
        it, one part after another on each task, after `save` returned: every update of the
        steps up to N, and those of later steps that had reached it by then. A "div" shard is
        read at one moment, a "mod" chunk or a dynamic table shard by shard; under
        parameter_server the parts of one ps, and of different ps, are read moments apart.
        Why: a copy of the tables at the step would be a second copy of every table, and the
        tables' memory is what bounds a ps.

        So a run resumed from it starts exactly at step N + 1, with the step counter and the
        dense state of step N, and ends exactly at train_steps; the rows that later steps
        updated before the write read them hold those updates once more, as asynchronous
        training's stale reads do (the input is not in a checkpoint: a restarted input
        pipeline starts its share again, whatever the writer). A save followed by `wait()`
        before the next step (the final save; one whose files are needed at once) holds
        every part as of step N.

        A write the storage refuses ends the task with one sentence (`CheckpointWriteError`,
        `StorageUnavailable`) after its leftovers are removed; the previous checkpoint stays
        the newest.
        """
        self._writer.save(step)

    def wait(self) -> None:
        """Returns once every save asked for is durable (files complete and listed); raises the
        error of one that failed. At once when nothing is pending (always, for the synchronous
        writer)."""
        self._writer.wait()
