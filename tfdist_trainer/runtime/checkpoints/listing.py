"""The ``checkpoint`` file and the files of each checkpoint: what readers see of a directory.

Every reader (the evaluator side-car, ``--mode=evaluate/export``, the launcher, a
restarted task) finds checkpoints through the directory's ``checkpoint`` file,
so that file is what makes a checkpoint visible, and it changes in one order:

* a checkpoint is listed only once its files are complete (TF writes
  ``ckpt-N_temp/`` and merges it into ``ckpt-N.index`` / ``.data-*`` before
  `CheckpointManager` lists it; the traced write lists after it returns), so
  a reader never opens a half-written checkpoint;
* a checkpoint is unlisted before its files are deleted or renamed, so a
  reader never finds a listed checkpoint without its files.

A writer added later (an asynchronous one) keeps both rules: it lists a
checkpoint when its write has finished, not when the save was asked for.
"""

from __future__ import annotations

import dataclasses
import os
import re

import tensorflow as tf

from tfdist_trainer.io import storage


def basename(prefix: str) -> str:
    """``ckpt-200`` of ``.../ckpt-200``."""
    return prefix.rstrip("/").rsplit("/", 1)[-1]


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one task's checkpoints go.

    Attributes:
      model_dir: the run's directory, which readers look in.
      directory: where this task writes: model_dir for the writer (the chief); a throw-away
        directory for a synchronous peer, which takes part in every save and keeps nothing.
      is_writer: whether this task's checkpoints are the run's (the chief).
    """

    model_dir: str
    directory: str
    is_writer: bool

    def entry(self, path: str) -> str:
        """A path as CheckpointManager lists it: relative to the directory when that is absolute,
        so a model_dir copied elsewhere still finds its checkpoints."""
        if os.path.isabs(self.directory) and os.path.isabs(path):
            return os.path.relpath(path, self.directory)
        return path


def checkpoint_files(prefix: str) -> list[str]:
    """The files of checkpoint `prefix`: its ``.index`` and every ``.data-*`` shard.

    Exactly these, not ``prefix.*``: a checkpoint renamed aside
    (``ckpt-200.corrupt-<time>.index``) must survive the sweep of a later ``ckpt-200``.
    """
    index = f"{prefix}.index"
    shards = storage.glob(f"{prefix}.data-?????-of-?????")
    return ([index] if storage.exists(index) else []) + sorted(shards)


def listed_newest_first(directory: str) -> list[str]:
    """The checkpoints the directory's ``checkpoint`` file lists, newest first, whether or not
    their files exist (`tf.train.latest_checkpoint` says None when the newest's index is gone,
    which would restart the job from step 0)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except ValueError:  # an empty file ("Invalid checkpoint state"); a torn one reads as None
        state = None
    if state is None:
        return []
    newest = [state.model_checkpoint_path] if state.model_checkpoint_path else []
    return list(dict.fromkeys(newest + list(reversed(state.all_model_checkpoint_paths))))


def found_newest_first(directory: str) -> list[str]:
    """The checkpoints whose index is in `directory` (``ckpt-<step>.index``), newest first: what
    resuming uses when the ``checkpoint`` file itself is damaged."""
    named = re.compile(r"ckpt-(\d+)\.index$")
    steps = [
        int(match.group(1))
        for match in (
            named.match(os.path.basename(f))
            for f in storage.glob(storage.join(directory, "ckpt-*.index"))
        )
        if match
    ]
    return [storage.join(directory, f"ckpt-{step}") for step in sorted(steps, reverse=True)]


def write_checkpoint_list(
    directory: str,
    newest: str,
    *,
    paths: list[str],
    timestamps: list[float] | None,
    last_preserved_timestamp: float,
) -> None:
    """Rewrites the directory's ``checkpoint`` file with `paths` (oldest first, `newest` last).

    CheckpointManager can only drop the oldest checkpoints; sparing a pinned
    one in the middle needs the v1 writer, which TF marks deprecated with no
    replacement: its once-per-process deprecation warning is kept out of the
    task's log (it would say to use CheckpointManager, which this already does).
    """
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        tf.compat.v1.train.update_checkpoint_state(
            directory,
            newest,
            all_model_checkpoint_paths=paths,
            all_model_checkpoint_timestamps=timestamps,
            last_preserved_timestamp=last_preserved_timestamp,
        )
    finally:
        logger.setLevel(level)
