"""The background writer: `save` copies the small state and returns; a thread writes, lists, sweeps.

Training waits only for the copy of the small state (`snapshot`: the step
counter, dense weights, optimizer scalars, each copied on the task that holds
it), not for the tables nor for the storage. The thread's write reads the
tables a part at a time (`table_parts`: a shard or a 64 MiB chunk, each copied,
written, and let go before the next of its task), so a ps holds at most one
part besides its tables; the parts' files and the small state's are merged
into one checkpoint, under the keys a synchronous save gives them. The order
is `SyncWriter`'s (write, then list, then read the pin and sweep), so a reader
never sees a half-written checkpoint. What a checkpoint's step means when its
tables are read while training goes on: `Checkpointer.save`.

One save is in flight at a time: a second `save` first waits for the one before
(a slow disk slows training down to its speed instead of queueing copies).
`wait()` returns once the pending save is durable and raises its error, the
same one-sentence storage error a synchronous save raises, after the same
clean-up: the previous checkpoint stays the newest.

Used only where a save involves this task alone (one task, or parameter_server's
chief, whose ps write their own parts): where every worker takes part in a
save, collectives cannot run on a thread of one worker (`train.async_checkpoint`).
"""

from __future__ import annotations

import threading
import time

import tensorflow as tf

from tfdist_trainer.io import storage
from tfdist_trainer.runtime.checkpoints.snapshot import Snapshot
from tfdist_trainer.runtime.checkpoints.writer import SyncWriter


class BackgroundWriter(SyncWriter):
    """`save(step)` returns once the small state is copied; the files are written by a thread."""

    def __init__(self, checkpoint: tf.train.Checkpoint, *args, spans_tasks: bool, **kwargs):
        super().__init__(checkpoint, *args, spans_tasks=spans_tasks, **kwargs)
        self._snapshot: Snapshot | None = None
        # Saved as a synchronous save saves it (a restore expects it): made now, so that the
        # snapshot copies it; counted at each save where CheckpointManager would count it.
        _ = checkpoint.save_counter
        self._counts_saves = not spans_tasks
        # Every save, on one task or many, goes through one traced write (`writer`'s doc): the
        # tables' parts are ops of that function, chained so that a task holds one at a time.
        self._traced_write = tf.function(self._write_staged, autograph=False)
        # A new thread starts without the main thread's device scope: its ops would go to
        # /job:localhost instead of this task's CPU (`tf.constant` lands on the default device).
        self._device = tf.constant(0).device
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending_step = 0
        self._copied_s = 0.0

    def save(self, step: int) -> None:
        """Copies the small state of `step` and starts writing it (`Checkpointer.save`)."""
        if step in (self.last_saved_step, self._pending_step):
            return
        self.wait()
        self.ready()
        started = time.monotonic()
        if self._counts_saves:
            self._checkpoint.save_counter.assign_add(1)
        self._snapshot.take()
        copied_s = time.monotonic() - started
        self._pending_step = step
        self._thread = threading.Thread(
            target=self._write_in_background,
            args=(step, copied_s),
            name=f"checkpoint-{step}",
            daemon=True,
        )
        self._thread.start()

    def ready(self) -> None:
        """Makes the small state's copies and traces the write: after a restore, not before, so
        that a restart reads its tables without anything else in its way."""
        if self._snapshot is None:
            self._snapshot = Snapshot(self._checkpoint)
        super().ready()  # after the snapshot: the traced write saves its copies

    def wait(self) -> None:
        """Returns once the pending save is durable; raises its error (`Checkpointer.wait`)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._pending_step = 0
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write_staged(self, prefix: tf.Tensor) -> None:
        """The traced write of checkpoint `prefix`: the small state (TF's own save of the
        stand-ins, which records the tables' keys) and the tables' parts, each into files of
        their own beside where TF stages its own, then merged into `prefix`, whose ``.index``
        appears last (a save cut short leaves only the staging files, which a restart removes)."""
        staging = tf.strings.join(
            [
                prefix,
                # Where TF's own save stages its files: no directory on S3 (eventual consistency).
                tf.where(tf.strings.regex_full_match(prefix, "^s3://.*"), ".part", "_temp/part"),
            ]
        )
        state = tf.strings.join([staging, "-state"])
        written = self._checkpoint.write(state)
        writes, parts = self._snapshot.write_parts(staging)
        with tf.control_dependencies([written, *writes]):
            tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=tf.stack([state, *parts]),
                destination_prefix=prefix,
                delete_old_dirs=True,
            )

    def _write(self, step: int) -> str:
        # The staging directory first: SaveV2 makes the directory of its file but not that
        # directory's parent, and TF's save of the small state stages in a directory inside.
        # What is in its way (a file) is left to the write, whose error says it in one sentence.
        staging = storage.join(self._where.directory, f"ckpt-{step}_temp")
        if not staging.startswith("s3://") and not tf.io.gfile.exists(staging):
            tf.io.gfile.makedirs(staging)
        return super()._write(step)

    def _write_in_background(self, step: int, copied_s: float) -> None:
        self._copied_s = copied_s
        try:
            with tf.device(self._device):
                super().save(step)
        except BaseException as e:  # raised on the training thread by wait()
            self._error = e

    def _how(self) -> str:
        return f" in the background (training waited {self._copied_s:.2f}s for its copy)"
