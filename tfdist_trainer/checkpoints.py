"""Checkpoints: save every N steps and at the end, keep K, restore at start.

Under multi_worker_mirrored every worker must take part in a save (it runs
collectives), but only the chief's copy is kept: the others write into a
throw-away directory that is removed right after.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tfdist_trainer import storage
from tfdist_trainer.cluster import ClusterConfig


class Checkpointer:
    """Owns the CheckpointManager of one task."""

    def __init__(
        self,
        *,
        model_dir: str,
        cluster: ClusterConfig,
        checkpoint: tf.train.Checkpoint,
        global_step: tf.Variable,
        keep: int,
    ):
        self.model_dir = model_dir
        self.is_writer = cluster.is_chief
        self.global_step = global_step
        self._directory = (
            model_dir
            if self.is_writer
            else storage.join(model_dir, ".tmp_checkpoints", cluster.role.replace(":", "-"))
        )
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._directory, max_to_keep=keep, step_counter=global_step
        )
        self._checkpoint = checkpoint
        self._last_saved_step = 0

    def restore(self) -> int | None:
        """Restores the chief's latest checkpoint; returns its step, or None on a fresh start.

        A save killed half-way leaves only a ``ckpt-N_temp`` directory, never a
        `checkpoint` entry, so the previous checkpoint is what comes back; the
        chief removes such leftovers.
        """
        if self.is_writer:
            for leftover in storage.glob(storage.join(self.model_dir, "ckpt-*_temp")):
                logging.info("removing %s, left by a save that did not finish", leftover)
                storage.rmtree(leftover)
        latest = tf.train.latest_checkpoint(self.model_dir)
        if latest is None:
            return None
        self._checkpoint.restore(latest).assert_existing_objects_matched()
        step = int(self.global_step.numpy())
        self._last_saved_step = step
        logging.info("restored %s (step %d)", latest, step)
        return step

    def latest_step(self) -> int | None:
        """The step of the chief's latest checkpoint, without restoring it."""
        latest = tf.train.latest_checkpoint(self.model_dir)
        return int(latest.rsplit("-", 1)[1]) if latest else None

    def save(self, step: int) -> None:
        if self._last_saved_step == step:
            return
        path = self._manager.save(checkpoint_number=step)
        self._last_saved_step = step
        if self.is_writer:
            logging.info("saved checkpoint %s", path)
        else:
            storage.rmtree(self._directory)
            # the last worker out removes the parent
            storage.remove_if_empty(storage.dirname(self._directory))
