"""Resuming: the newest checkpoint that reads, with the damaged newer ones set aside.

A restart must not go back to step 0 because its newest checkpoint is damaged
(a disk that filled up, a torn object-store upload), nor silently: it restores
the newest checkpoint that reads, says once which it skipped and why, and the
chief sets each skipped one aside (renamed ``<prefix>.corrupt-<time>.*``, no
longer listed), so that every reader and the next restart agree. A model_dir
none of whose listed checkpoints reads is one sentence (`NoIntactCheckpoint`),
never a fresh start over a run's checkpoints.
"""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import CheckpointWriteError, NoIntactCheckpoint
from tfdist_trainer.io import storage
from tfdist_trainer.runtime.checkpoints.failures import model_mismatch, one_line, unreadable_reason
from tfdist_trainer.runtime.checkpoints.listing import (
    Location,
    basename,
    checkpoint_files,
    found_newest_first,
    listed_newest_first,
    write_checkpoint_list,
)
from tfdist_trainer.sharding import runtime_api as tables


def restore(
    checkpoint: tf.train.Checkpoint, global_step: tf.Variable, where: Location
) -> int | None:
    """Restores the chief's newest readable checkpoint; returns its step, or None when fresh.

    A save killed half-way leaves only a ``ckpt-N_temp`` directory, never a
    `checkpoint` entry, so the previous checkpoint is what comes back; the
    chief removes such leftovers. Newer checkpoints that cannot be read are
    skipped, and the chief sets them aside (module doc); every task skips the
    same ones, since all read the same files.
    """
    if where.is_writer:
        for leftover in storage.glob(storage.join(where.model_dir, "ckpt-*_temp")):
            logging.info("removing %s, left by a save that did not finish", leftover)
            storage.rmtree(leftover)
    candidates = listed_newest_first(where.model_dir)
    if not candidates:
        candidates = _found_when_unlisted(where)
    if not candidates:
        return None
    bad: list[tuple[str, str]] = []
    for prefix in candidates:
        reason = _read(checkpoint, prefix)
        if reason is None:
            break
        bad.append((prefix, reason))
    else:
        raise _none_intact(where.model_dir, bad)
    step = int(global_step.numpy())
    if bad:
        _skipped(where, bad, restored=prefix, step=step)
    logging.info("restored %s (step %d)", prefix, step)
    return step


def resumes(model_dir: str) -> bool:
    """Whether a task of model_dir restores a checkpoint (or ends, when none reads): what
    `restore` finds, before the model is built."""
    if listed_newest_first(model_dir):
        return True
    return storage.exists(storage.join(model_dir, "checkpoint")) and bool(
        found_newest_first(model_dir)
    )


def _found_when_unlisted(where: Location) -> list[str]:
    """The checkpoints on disk, newest first, when a ``checkpoint`` file exists but cannot be
    read (torn or empty: TF would then start again from step 0, saying only a warning). The
    chief lists them again, so that every reader (evaluator, launcher) finds them too."""
    listing = storage.join(where.model_dir, "checkpoint")
    found = found_newest_first(where.model_dir) if storage.exists(listing) else []
    if not found:
        return []
    logging.warning(
        "%s cannot be read; resuming from the checkpoints found beside it: %s",
        listing,
        ", ".join(basename(p) for p in found),
    )
    if where.is_writer:
        now = time.time()
        write_checkpoint_list(
            where.directory,
            where.entry(found[0]),
            paths=[where.entry(p) for p in reversed(found)],
            timestamps=[now] * len(found),
            last_preserved_timestamp=now - 1,  # CheckpointManager keeps only later ones
        )
    return found


def _read(checkpoint: tf.train.Checkpoint, prefix: str) -> str | None:
    """Restores `prefix`; None when it read, else why its files cannot be read (the variables
    it set before failing are all set again by the older checkpoint restored next)."""
    if not storage.exists(f"{prefix}.index"):
        return "its .index file is missing"
    try:
        # The sharded tables after the rest, a slice at a time: a ps never holds its tables twice.
        with tables.restored_apart(checkpoint) as restore_tables:
            checkpoint.restore(prefix).assert_existing_objects_matched()
            restore_tables(prefix)
    except AssertionError as e:
        raise model_mismatch(prefix, e, "this model", checkpoint) from None
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        if isinstance(e, tf.errors.InvalidArgumentError) and (
            "does not match the shape stored in checkpoint" not in str(e)
        ):
            raise
        # A variable of another shape (a table of another size: TF's InvalidArgumentError; a
        # Keras variable: its ValueError "Received incompatible tensor with shape ..."). A
        # functional model saves its layers by position, so a model with other layers meets
        # this as often as a missing object: the model's fault, not the files'.
        raise model_mismatch(prefix, e, "this model", checkpoint) from None
    except (IndexError, tf.errors.OpError) as e:
        reason = unreadable_reason(e)
        if reason is None:
            raise
        return reason
    return None


def _none_intact(model_dir: str, bad: list[tuple[str, str]]) -> NoIntactCheckpoint:
    """The one sentence for a model_dir none of whose listed checkpoints reads (none moved)."""
    which = "; ".join(f"{basename(p)}: {reason}" for p, reason in bad)
    listing = storage.join(model_dir, "checkpoint")
    return NoIntactCheckpoint(
        f"no checkpoint listed in {listing} can be read ({which}), so training cannot resume: "
        f"copy intact checkpoint files back from a backup, or move {listing} aside to train "
        f"again from step 0"
    )


def _skipped(where: Location, bad: list[tuple[str, str]], *, restored: str, step: int) -> None:
    """Says once per bad checkpoint that it was skipped; the chief sets each aside.

    The ``checkpoint`` file is rewritten first and the files renamed after, as in
    the writer's sweep: a reader never finds a listed checkpoint without its files.
    """
    if not where.is_writer:
        for prefix, reason in bad:
            logging.info(
                "skipped %s, which cannot be read (%s); resuming from %s (step %d), "
                "as the chief does",
                prefix,
                reason,
                basename(restored),
                step,
            )
        return
    _unlist(where, {basename(p) for p, _ in bad}, newest=restored)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for prefix, reason in bad:
        aside = _set_aside(prefix, stamp)
        logging.warning(
            "checkpoint %s cannot be read (%s): resumed from %s (step %d) instead; %s, "
            "and %s no longer lists it",
            prefix,
            reason,
            basename(restored),
            step,
            f"its files are renamed to {aside}.*" if aside else "it has no files left",
            storage.join(where.model_dir, "checkpoint"),
        )


def _unlist(where: Location, names: set[str], *, newest: str) -> None:
    """Drops the checkpoints named `names` (basenames) from the ``checkpoint`` file, whose
    newest becomes `newest` (the one restored)."""
    state = tf.train.get_checkpoint_state(where.directory)
    listed = list(state.all_model_checkpoint_paths)
    stamps = list(state.all_model_checkpoint_timestamps)
    if len(stamps) != len(listed):  # as the writer does: CheckpointManager drops older stamps
        stamps = [time.time()] * len(listed)
    kept = [i for i, p in enumerate(listed) if basename(p) not in names]
    write_checkpoint_list(
        where.directory,
        where.entry(newest),
        paths=[where.entry(listed[i]) for i in kept],
        timestamps=[stamps[i] for i in kept],
        last_preserved_timestamp=state.last_preserved_timestamp,
    )


def _set_aside(prefix: str, stamp: str) -> str | None:
    """Renames the files of `prefix` to ``<prefix>.corrupt-<stamp>.*``, itself a checkpoint
    prefix that TF's reader can open to look at what is left; returns its basename, or
    None when `prefix` had no files."""
    files = checkpoint_files(prefix)
    aside = f"{prefix}.corrupt-{stamp}"
    try:
        for file in files:
            storage.rename(file, aside + file[len(prefix) :])
    except storage.write_errors() as e:
        raise CheckpointWriteError(
            f"could not rename the unreadable checkpoint {prefix} aside: {one_line(e)}; "
            f"give this task write access to model_dir"
        ) from None
    return basename(aside) if files else None
