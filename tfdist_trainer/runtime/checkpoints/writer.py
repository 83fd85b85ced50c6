"""The checkpoint writer: writes ``ckpt-<step>``, lists it, then sweeps the old ones.

This is the one module that writes checkpoints, so the one to change for an
asynchronous writer: `Checkpointer` only forwards `save(step)` and `wait()`
here, and the training task calls those from one place
(`RunContext.save_checkpoint`). An asynchronous writer keeps this module's
order: write, then list (`listing`: a reader never sees a half-written
checkpoint), then read the pin and sweep; `wait()` returns once that is done.

Under multi_worker_mirrored every worker must take part in a save (it runs
collectives), but only the chief's copy is kept: the others write into a
throw-away directory that is removed right after. Each peer's directory sits
directly in model_dir (``.tmp_checkpoints-worker-1``), not under a shared
parent: a peer that removed an emptied shared parent could do so between
another peer's creating it and creating its own directory inside (seen in the
20-fault chaos run: `No such file or directory` on a save, and one more restart).

When the variables live on other tasks (parameter_server), every save goes
through one traced function. TF's own save defines a new function per call
when a checkpoint spans tasks, and a new function is registered on every
task of the cluster: a worker whose link went silent would hang that save,
and with it the chief, for good (no watchdog can run while it waits). One
function, traced at the first save, never needs the workers again.
"""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from tfdist_trainer.io import storage
from tfdist_trainer.runtime.checkpoints.failures import save_failure
from tfdist_trainer.runtime.checkpoints.listing import (
    Location,
    basename,
    checkpoint_files,
    listed_newest_first,
    write_checkpoint_list,
)
from tfdist_trainer.runtime.checkpoints.pins import pinned


class SyncWriter:
    """Writes each checkpoint before `save` returns; `wait` has nothing to wait for.

    Attributes:
      last_saved_step: the step of the newest checkpoint this task wrote or restored (0: none);
        a save of that step again does nothing.
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        where: Location,
        *,
        keep: int,
        spans_tasks: bool,
        alone: bool,
    ):
        """`spans_tasks`: the variables live on other tasks (module doc); `alone`: a write that
        does not answer can only be the storage's (in a cluster it may be a lost peer)."""
        self._checkpoint = checkpoint
        self._where = where
        self._keep = keep
        self._alone = alone
        self._spared: str | None = None  # the pinned checkpoint last spared, to say so once
        self.last_saved_step = 0
        self._traced_write = None
        self._write_function = None
        if spans_tasks:
            # Made now, outside the function, so that it is saved as CheckpointManager saves it
            # (a restore expects it).
            _ = checkpoint.save_counter
            self._traced_write = tf.function(
                lambda prefix: checkpoint.write(prefix), autograph=False
            )
        self.write_traced = False

    def save(self, step: int) -> None:
        """Writes, lists and sweeps checkpoint ``ckpt-<step>`` before returning (`Checkpointer.save`)."""
        if self.last_saved_step == step:
            return
        try:
            self._save(step)
        except tf.errors.OpError as e:
            path = storage.join(self._where.directory, f"ckpt-{step}")
            error = save_failure(e, path, unavailable=self._alone)
            if error is None:
                raise
            self._clean_up_failed_save(path)
            if self.last_saved_step:  # what a restart resumes from
                kept = f"ckpt-{self.last_saved_step} stays the newest checkpoint"
                error.args = (f"{error}; {kept}",)
            raise error from None

    def ready(self) -> None:
        """Called once the state is restored (or fresh), before the first save, on the training
        thread: traces the write now, while every task answers. Defining a function registers
        it on every task of the cluster; done at the first save, in the background or by the
        stall save, that waits for good on a worker whose link went down meanwhile."""
        if self._traced_write is not None and self._write_function is None:
            self._write_function = self._traced_write.get_concrete_function(
                tf.TensorSpec([], tf.string)
            )

    def wait(self) -> None:
        """Every save returned durable: nothing is pending (`Checkpointer.wait`)."""

    def _save(self, step: int) -> None:
        where = self._where
        if not where.is_writer:  # a synchronous peer takes part in the save, then drops its copy
            tf.train.CheckpointManager(self._checkpoint, where.directory, max_to_keep=1).save(
                checkpoint_number=step
            )
            self.last_saved_step = step
            storage.rmtree(where.directory)
            return
        # Write first, sweep after: the pin is read once the (possibly long) write is done, right
        # before anything is deleted, so a checkpoint the evaluator pinned while this one was
        # being written is never deleted under it.
        started = time.monotonic()
        path = self._write(step)
        self.last_saved_step = step
        # How long a save takes is what a preempted task's grace period must cover (BUILD.md).
        logging.info(
            "saved checkpoint %s in %.2fs%s", path, time.monotonic() - started, self._how()
        )
        self._sweep()

    def _how(self) -> str:
        """What the "saved checkpoint" line adds about how it was saved (a background writer's)."""
        return ""

    def _clean_up_failed_save(self, path: str) -> None:
        """Removes what a failed save of checkpoint `path` left: its ``_temp`` directory, its
        files when the ``checkpoint`` file does not list it (a merge that ran out of space),
        and a torn ``checkpoint.tmp*``; a peer's throw-away directory goes whole. The previous
        checkpoint stays listed. What cannot be removed (a read-only disk) is said, not raised."""
        try:
            leftovers = self._leftovers(path)
        except storage.write_errors() as e:
            logging.warning("could not list what the failed save of %s left: %s", path, e)
            leftovers = [f"{path}_temp"]
        for leftover in leftovers:
            try:
                if storage.isdir(leftover):
                    storage.rmtree(leftover)
                else:
                    storage.remove(leftover)
            except storage.write_errors() as e:
                logging.warning("could not remove %s after the failed save: %s", leftover, e)

    def _leftovers(self, path: str) -> list[str]:
        """What a failed save of checkpoint `path` may have left (`_clean_up_failed_save`)."""
        directory = self._where.directory
        if not self._where.is_writer:
            return [directory]
        listed = {basename(p) for p in listed_newest_first(directory)}
        unlisted = [] if basename(path) in listed else checkpoint_files(path)
        torn = storage.glob(storage.join(directory, "checkpoint.tmp*"))
        return [f"{path}_temp", *unlisted, *torn]

    def _write(self, step: int) -> str:
        """Writes checkpoint ``ckpt-<step>``, then lists it in the directory's ``checkpoint``
        file: listed only once its files are complete (`listing`)."""
        where = self._where
        if self._traced_write is None:
            manager = tf.train.CheckpointManager(
                self._checkpoint, where.directory, max_to_keep=None
            )
            return manager.save(checkpoint_number=step)
        path = storage.join(where.directory, f"ckpt-{step}")
        # The concrete function `ready()` traced: called from another thread (the stall save's, a
        # background write's) the tf.function would trace again (the strategy scope is per
        # thread), and register the new function on every task, silent workers included.
        self.ready()
        self._write_function(tf.constant(path))
        self.write_traced = True
        state = tf.train.get_checkpoint_state(where.directory)
        listed = list(state.all_model_checkpoint_paths) if state else []
        stamps = list(state.all_model_checkpoint_timestamps) if state else []
        if len(stamps) != len(listed):
            stamps = [time.time()] * len(listed)
        kept = [i for i, p in enumerate(listed) if basename(p) != basename(path)]
        write_checkpoint_list(
            where.directory,
            where.entry(path),
            paths=[where.entry(listed[i]) for i in kept] + [where.entry(path)],
            timestamps=[stamps[i] for i in kept] + [time.time()],
            last_preserved_timestamp=state.last_preserved_timestamp if state else time.time(),
        )
        return path

    def _sweep(self) -> None:
        """Keeps the newest `keep` checkpoints and the one the evaluator pinned; deletes the rest.

        The kept list (with its timestamps, which a later CheckpointManager needs to go on
        sweeping) is written to model_dir's ``checkpoint`` file before any file is
        deleted, so a reader never finds a listed checkpoint missing. A slow evaluator
        costs one checkpoint's space, not one per checkpoint saved while it evaluates.
        """
        where = self._where
        state = tf.train.get_checkpoint_state(where.directory)
        listed = list(state.all_model_checkpoint_paths)
        stamps = list(state.all_model_checkpoint_timestamps)
        name = pinned(where.model_dir)
        newest_kept = listed[-self._keep :]
        spared = [p for p in listed if basename(p) == name and p not in newest_kept]
        if spared and name != self._spared:  # said once at INFO: a slow evaluator would repeat it
            logging.log(
                logging.INFO if self._spared is None else logging.DEBUG,
                "keeping %s while the evaluator reads it, besides the newest %d checkpoint(s) "
                "(train.keep_checkpoints); later checkpoints it reads are kept the same way",
                name,
                self._keep,
            )
            self._spared = name
        kept = [i for i, p in enumerate(listed) if p in newest_kept or p in spared]
        if len(kept) == len(listed):
            return
        write_checkpoint_list(
            where.directory,
            where.entry(state.model_checkpoint_path),
            paths=[where.entry(listed[i]) for i in kept],
            timestamps=[stamps[i] for i in kept] if stamps else None,
            last_preserved_timestamp=state.last_preserved_timestamp,
        )
        for i, prefix in enumerate(listed):
            if i not in kept:
                for file in checkpoint_files(prefix):
                    storage.remove(file)
