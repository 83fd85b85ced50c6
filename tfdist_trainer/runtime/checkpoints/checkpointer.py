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
        background writer returns once the state is copied and writes it on a thread (the
        synchronous one returns durable); a caller calls `wait()` before it needs the files
        (an export from them, the done marker, an exit). The state may change as soon as
        `save` returns.

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
