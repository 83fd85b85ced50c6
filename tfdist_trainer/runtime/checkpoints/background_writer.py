"""The background writer: `save` copies the state and returns; another thread writes, lists, sweeps.

Training waits only for the copy (`snapshot`: each tensor copied on the device
that holds it, a parameter server's tables on that ps), not for the storage.
The write itself is `SyncWriter`'s, in the same order (write, then list, then
read the pin and sweep), so a reader never sees a half-written checkpoint.

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

from tfdist_trainer.runtime.checkpoints.snapshot import Snapshot
from tfdist_trainer.runtime.checkpoints.writer import SyncWriter


class BackgroundWriter(SyncWriter):
    """`save(step)` returns once the state is copied; the files are written by a thread."""

    def __init__(self, checkpoint: tf.train.Checkpoint, *args, **kwargs):
        super().__init__(checkpoint, *args, **kwargs)
        self._snapshot: Snapshot | None = None
        # A new thread starts without the main thread's device scope: its ops would go to
        # /job:localhost instead of this task's CPU (`tf.constant` lands on the default device).
        self._device = tf.constant(0).device
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pending_step = 0
        self._copied_s = 0.0

    def save(self, step: int) -> None:
        """Copies the state of `step` and starts writing it (`Checkpointer.save`)."""
        if step in (self.last_saved_step, self._pending_step):
            return
        self.wait()
        self.ready()
        started = time.monotonic()
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
        """Makes the copies (a second copy of the state, on its devices) and traces the write:
        after a restore, not before, so that a restart reads its tables without the copies in
        its way."""
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

    def _write_in_background(self, step: int, copied_s: float) -> None:
        self._copied_s = copied_s
        try:
            with tf.device(self._device):
                super().save(step)
        except BaseException as e:  # raised on the training thread by wait()
            self._error = e

    def _how(self) -> str:
        return f" in the background (training waited {self._copied_s:.2f}s for its copy)"
