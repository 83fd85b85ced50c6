"""Checkpoints: save every N steps and at the end, keep K, restore at start.

Under multi_worker_mirrored every worker must take part in a save (it runs
collectives), but only the chief's copy is kept: the others write into a
throw-away directory that is removed right after. Each peer's directory sits
directly in model_dir (``.tmp_checkpoints-worker-1``), not under a shared
parent: a peer that removed an emptied shared parent could do so between
another peer's creating it and creating its own directory inside (seen in the
20-fault chaos run: `No such file or directory` on a save, and one more restart).

The evaluator side-car pins the checkpoint it is reading (`pin`): a small
file under model_dir naming it, which the chief reads before each save and
spares from ``train.keep_checkpoints``. Without it a chief that saves faster
than a large model restores could delete every checkpoint before the
evaluator has read one. A file, not a lock or a clock: it works the same on
a shared disk and on an object store, across hosts. The chief reads the pin
after writing a checkpoint, right before it deletes old ones. The one race
left (the chief reads the pin just before the evaluator writes it, then
deletes that checkpoint) is the evaluator's to handle: its restore fails, or
the checkpoint is gone once restored, and it takes the newest checkpoint,
which is pinned before the chief sweeps again.

When the variables live on other tasks (parameter_server), every save goes
through one traced function. TF's own save defines a new function per call
when a checkpoint spans tasks, and a new function is registered on every
task of the cluster: a worker whose link went silent would hang that save,
and with it the chief, for good (no watchdog can run while it waits). One
function, traced at the first save, never needs the workers again.
"""

from __future__ import annotations

import json
import os
import re
import time

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import (
    CheckpointWriteError,
    ConfigError,
    NoIntactCheckpoint,
    StorageUnavailable,
    TfdistError,
)
from tfdist_trainer.io import storage
from tfdist_trainer.io.checkpoint_names import step_of  # noqa: F401  (re-exported)
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.sharding.checkpoint_mismatch import table_kind_mismatch

#: Where the evaluator names the checkpoint it is reading, relative to model_dir.
PIN_FILE = storage.join("eval", "pinned_checkpoint.json")


def pin(model_dir: str, prefix: str, *, by: str) -> None:
    """Asks the chief to keep checkpoint `prefix` until another is pinned or `unpin` is called."""
    path = storage.join(model_dir, PIN_FILE)
    storage.makedirs(storage.dirname(path))
    storage.write_text(
        path,
        json.dumps({"checkpoint": _basename(prefix), "by": by}) + "\n",
    )


def unpin(model_dir: str) -> None:
    storage.remove(storage.join(model_dir, PIN_FILE))


def pinned(model_dir: str) -> str | None:
    """The basename (``ckpt-200``) of the pinned checkpoint, or None."""
    record = storage.read_json(storage.join(model_dir, PIN_FILE))
    name = record.get("checkpoint") if isinstance(record, dict) else None
    return name if isinstance(name, str) else None


def _basename(prefix: str) -> str:
    return prefix.rstrip("/").rsplit("/", 1)[-1]


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


#: TF's decorations of an op's error: ``{{function_node ...}}``, ``[[{{node RestoreV2}}]]``,
#: ``[Op:SaveV2]``.
_DECORATIONS = re.compile(r"\{\{[^}]*\}\}|\[\[.*?\]\]|\[Op:[^\]]*\]")

#: An error of several tasks: ``2 root error(s) found.``, then ``(0) RESOURCE_EXHAUSTED: <cause>``.
_ROOT_ERRORS = re.compile(r"\d+ root error\(s\) found")
_ROOT_ERROR = re.compile(r"\(\d+\) [A-Z_]+: (.*)")


def _one_line(error: BaseException) -> str:
    """TF's message in one line, without its decorations. A function's error (under
    parameter_server the restore and the traced write are functions) starts with ``Graph
    execution error:`` and the place it was defined; its cause is its last line. An error of
    several tasks says ``N root error(s) found.``, then each: the first is the cause."""
    text = getattr(error, "message", None) or str(error)
    lines = [_DECORATIONS.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(error).__name__
    if lines[0] == "Graph execution error:":
        return lines[-1][:300]
    causes = [m.group(1) for m in map(_ROOT_ERROR.match, lines[1:]) if m and m.group(1)]
    return (causes[0] if causes and _ROOT_ERRORS.match(lines[0]) else lines[0])[:300]


#: TF's NotFoundError for a variable or container that another task no longer holds.
_GONE_ON_A_PEER = re.compile(r"(Resource|Container) \S.* does not exist")


def unreadable_reason(error: BaseException) -> str | None:
    """Why a checkpoint's files cannot be read, when `error` says they are damaged or missing;
    None for any other failure (a lost ps, a model that does not match), which must not be
    mistaken for a bad checkpoint.

    Measured on TF 2.21 (BUILD.md): a truncated data file raises ``IndexError: Read less bytes
    than requested``; a flipped byte ``DataLossError`` (``Checksum does not match``), or a plain
    `OpError` of code UNKNOWN for the object graph's own tensor; a damaged index an UNKNOWN
    `OpError` (``not an sstable``, ``block checksum mismatch``); a missing file
    ``NotFoundError``, or UNKNOWN ``No such file or directory``.
    """
    damaged = (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.NotFoundError)
    if isinstance(error, tf.errors.NotFoundError) and _GONE_ON_A_PEER.search(str(error)):
        return None  # a restarted ps lost its variables: the cluster's problem, not the files'
    if isinstance(error, (IndexError, *damaged)) or (
        isinstance(error, tf.errors.OpError) and error.error_code == tf.errors.UNKNOWN
    ):
        return f"{type(error).__name__}: {_one_line(error)}"
    return None


def model_mismatch(prefix: str, error: AssertionError, what: str) -> ConfigError:
    """One sentence for a checkpoint that is not of this model (TensorFlow's AssertionError lists the
    model's objects it holds no values for): tables of the other kind by name, else the first line."""
    text = str(error).strip()
    specific = table_kind_mismatch(prefix, text)
    if specific:
        return ConfigError(specific)
    first = text.splitlines()[0][:200] if text else type(error).__name__
    return ConfigError(
        f"{prefix} is not a checkpoint of {what} ({first}); point --model_dir (or --checkpoint) "
        f"at a run of the same model and gin config."
    )


def _save_failure(error: tf.errors.OpError, path: str, *, unavailable: bool) -> TfdistError | None:
    """The one-sentence error for a checkpoint write the storage refused, or None for another
    failure. `unavailable`: a storage that does not answer is told apart from a lost peer
    (only a task alone can be sure; elsewhere TF's lost-peer errors look the same)."""
    cause = _one_line(error).rsplit("; ", 1)[-1]
    fixes = {
        tf.errors.ResourceExhaustedError: "free space there or move model_dir to a larger disk "
        "(train.keep_checkpoints keeps fewer)",
        tf.errors.PermissionDeniedError: "give this task write access to model_dir",
        tf.errors.NotFoundError: "check that model_dir still exists and is mounted",
        tf.errors.FailedPreconditionError: "check that every part of the path is a directory",
    }
    for kind, fix in fixes.items():
        if isinstance(error, kind):
            return CheckpointWriteError(
                f"could not save checkpoint {path}: {cause} ({type(error).__name__}); {fix}"
            )
    if unavailable and isinstance(
        error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)
    ):
        return StorageUnavailable(
            f"could not save checkpoint {path}: the storage did not answer ({cause}, "
            f"{type(error).__name__}); a restart resumes from the previous checkpoint"
        )
    return None


#: A synchronous peer's throw-away checkpoint directory in model_dir: this, then its role.
PEER_DIRECTORY_PREFIX = ".tmp_checkpoints-"


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
        spans_tasks: bool = False,
    ):
        """`spans_tasks`: the variables live on other tasks (parameter_server); see the module doc."""
        self.model_dir = model_dir
        self.is_writer = cluster.is_chief
        self.global_step = global_step
        self._directory = (
            model_dir
            if self.is_writer
            else storage.join(model_dir, PEER_DIRECTORY_PREFIX + cluster.role.replace(":", "-"))
        )
        self._keep = keep
        self._spared: str | None = None  # the pinned checkpoint last spared, to say so once
        self._checkpoint = checkpoint
        self._last_saved_step = 0
        self._traced_write = None
        if spans_tasks:
            # Made now, outside the function, so that it is saved as CheckpointManager saves it
            # (a restore expects it).
            _ = checkpoint.save_counter
            self._traced_write = tf.function(
                lambda prefix: checkpoint.write(prefix), autograph=False
            )
        self._write_traced = False
        # Alone, an unanswered write can only be the storage's; in a cluster it may be a lost peer.
        self._alone = cluster.is_local and not spans_tasks

    def restore(self) -> int | None:
        """Restores the chief's newest readable checkpoint; returns its step, or None when fresh.

        A save killed half-way leaves only a ``ckpt-N_temp`` directory, never a
        `checkpoint` entry, so the previous checkpoint is what comes back; the
        chief removes such leftovers. Newer checkpoints that cannot be read are
        skipped, and the chief sets them aside (module doc); every task skips the
        same ones, since all read the same files.
        """
        if self.is_writer:
            for leftover in storage.glob(storage.join(self.model_dir, "ckpt-*_temp")):
                logging.info("removing %s, left by a save that did not finish", leftover)
                storage.rmtree(leftover)
        candidates = listed_newest_first(self.model_dir)
        if not candidates:
            candidates = self._found_when_unlisted()
        if not candidates:
            return None
        bad: list[tuple[str, str]] = []
        for prefix in candidates:
            reason = self._read(prefix)
            if reason is None:
                break
            bad.append((prefix, reason))
        else:
            raise self._none_intact(bad)
        step = int(self.global_step.numpy())
        self._last_saved_step = step
        if bad:
            self._skipped(bad, restored=prefix, step=step)
        logging.info("restored %s (step %d)", prefix, step)
        return step

    def _found_when_unlisted(self) -> list[str]:
        """The checkpoints on disk, newest first, when a ``checkpoint`` file exists but cannot be
        read (torn or empty: TF would then start again from step 0, saying only a warning). The
        chief lists them again, so that every reader (evaluator, launcher) finds them too."""
        listing = storage.join(self.model_dir, "checkpoint")
        found = found_newest_first(self.model_dir) if storage.exists(listing) else []
        if not found:
            return []
        logging.warning(
            "%s cannot be read; resuming from the checkpoints found beside it: %s",
            listing,
            ", ".join(_basename(p) for p in found),
        )
        if self.is_writer:
            now = time.time()
            _write_checkpoint_list(
                self._directory,
                self._entry(found[0]),
                paths=[self._entry(p) for p in reversed(found)],
                timestamps=[now] * len(found),
                last_preserved_timestamp=now - 1,  # CheckpointManager keeps only later ones
            )
        return found

    def _read(self, prefix: str) -> str | None:
        """Restores `prefix`; None when it read, else why its files cannot be read (the variables
        it set before failing are all set again by the older checkpoint restored next)."""
        if not storage.exists(f"{prefix}.index"):
            return "its .index file is missing"
        try:
            self._checkpoint.restore(prefix).assert_existing_objects_matched()
        except AssertionError as e:
            raise model_mismatch(prefix, e, "this model") from None
        except (IndexError, tf.errors.OpError) as e:
            reason = unreadable_reason(e)
            if reason is None:
                raise
            return reason
        return None

    def _none_intact(self, bad: list[tuple[str, str]]) -> NoIntactCheckpoint:
        """The one sentence for a model_dir none of whose listed checkpoints reads (none moved)."""
        which = "; ".join(f"{_basename(p)}: {reason}" for p, reason in bad)
        listing = storage.join(self.model_dir, "checkpoint")
        return NoIntactCheckpoint(
            f"no checkpoint listed in {listing} can be read ({which}), so training cannot resume: "
            f"copy intact checkpoint files back from a backup, or move {listing} aside to train "
            f"again from step 0"
        )

    def _skipped(self, bad: list[tuple[str, str]], *, restored: str, step: int) -> None:
        """Says once per bad checkpoint that it was skipped; the chief sets each aside.

        The ``checkpoint`` file is rewritten first and the files renamed after, as in
        `_sweep`: a reader never finds a listed checkpoint without its files.
        """
        if not self.is_writer:
            for prefix, reason in bad:
                logging.info(
                    "skipped %s, which cannot be read (%s); resuming from %s (step %d), "
                    "as the chief does",
                    prefix,
                    reason,
                    _basename(restored),
                    step,
                )
            return
        self._unlist({_basename(p) for p, _ in bad}, newest=restored)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for prefix, reason in bad:
            aside = self._set_aside(prefix, stamp)
            logging.warning(
                "checkpoint %s cannot be read (%s): resumed from %s (step %d) instead; %s, "
                "and %s no longer lists it",
                prefix,
                reason,
                _basename(restored),
                step,
                f"its files are renamed to {aside}.*" if aside else "it has no files left",
                storage.join(self.model_dir, "checkpoint"),
            )

    def _unlist(self, names: set[str], *, newest: str) -> None:
        """Drops the checkpoints named `names` (basenames) from the ``checkpoint`` file, whose
        newest becomes `newest` (the one restored)."""
        state = tf.train.get_checkpoint_state(self._directory)
        listed = list(state.all_model_checkpoint_paths)
        stamps = list(state.all_model_checkpoint_timestamps)
        if len(stamps) != len(listed):  # as `_write` does: CheckpointManager drops older stamps
            stamps = [time.time()] * len(listed)
        kept = [i for i, p in enumerate(listed) if _basename(p) not in names]
        _write_checkpoint_list(
            self._directory,
            self._entry(newest),
            paths=[self._entry(listed[i]) for i in kept],
            timestamps=[stamps[i] for i in kept],
            last_preserved_timestamp=state.last_preserved_timestamp,
        )

    def _set_aside(self, prefix: str, stamp: str) -> str | None:
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
                f"could not rename the unreadable checkpoint {prefix} aside: {_one_line(e)}; "
                f"give this task write access to model_dir"
            ) from None
        return _basename(aside) if files else None

    @property
    def saves_without_the_workers(self) -> bool:
        """True once a save needs only this task and the ps: the traced write exists (module doc)."""
        return self._write_traced

    def latest_step(self) -> int | None:
        """The step of the chief's latest checkpoint, without restoring it."""
        latest = tf.train.latest_checkpoint(self.model_dir)
        return step_of(latest) if latest else None

    def save(self, step: int) -> None:
        """Saves checkpoint ``ckpt-<step>``; a write the storage refuses ends the task with one
        sentence (`CheckpointWriteError`, `StorageUnavailable`) after its leftovers are removed."""
        if self._last_saved_step == step:
            return
        try:
            self._save(step)
        except tf.errors.OpError as e:
            path = storage.join(self._directory, f"ckpt-{step}")
            error = _save_failure(e, path, unavailable=self._alone)
            if error is None:
                raise
            self._clean_up_failed_save(path)
            if self._last_saved_step:  # what a restart resumes from
                kept = f"ckpt-{self._last_saved_step} stays the newest checkpoint"
                error.args = (f"{error}; {kept}",)
            raise error from None

    def _save(self, step: int) -> None:
        if not self.is_writer:  # a synchronous peer takes part in the save, then drops its copy
            tf.train.CheckpointManager(self._checkpoint, self._directory, max_to_keep=1).save(
                checkpoint_number=step
            )
            self._last_saved_step = step
            storage.rmtree(self._directory)
            return
        # Write first, sweep after: the pin is read once the (possibly long) write is done, right
        # before anything is deleted, so a checkpoint the evaluator pinned while this one was
        # being written is never deleted under it.
        started = time.monotonic()
        path = self._write(step)
        self._last_saved_step = step
        # How long a save takes is what a preempted task's grace period must cover (BUILD.md).
        logging.info("saved checkpoint %s in %.2fs", path, time.monotonic() - started)
        self._sweep()

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
        if not self.is_writer:
            return [self._directory]
        listed = {_basename(p) for p in listed_newest_first(self._directory)}
        unlisted = [] if _basename(path) in listed else checkpoint_files(path)
        torn = storage.glob(storage.join(self._directory, "checkpoint.tmp*"))
        return [f"{path}_temp", *unlisted, *torn]

    def _write(self, step: int) -> str:
        """Writes checkpoint ``ckpt-<step>`` and lists it in the directory's ``checkpoint`` file."""
        if self._traced_write is None:
            manager = tf.train.CheckpointManager(
                self._checkpoint, self._directory, max_to_keep=None
            )
            return manager.save(checkpoint_number=step)
        path = storage.join(self._directory, f"ckpt-{step}")
        self._traced_write(tf.constant(path))
        self._write_traced = True
        state = tf.train.get_checkpoint_state(self._directory)
        listed = list(state.all_model_checkpoint_paths) if state else []
        stamps = list(state.all_model_checkpoint_timestamps) if state else []
        if len(stamps) != len(listed):
            stamps = [time.time()] * len(listed)
        kept = [i for i, p in enumerate(listed) if _basename(p) != _basename(path)]
        _write_checkpoint_list(
            self._directory,
            self._entry(path),
            paths=[self._entry(listed[i]) for i in kept] + [self._entry(path)],
            timestamps=[stamps[i] for i in kept] + [time.time()],
            last_preserved_timestamp=state.last_preserved_timestamp if state else time.time(),
        )
        return path

    def _entry(self, path: str) -> str:
        """A path as CheckpointManager lists it: relative to the directory when that is absolute,
        so a model_dir copied elsewhere still finds its checkpoints."""
        if os.path.isabs(self._directory) and os.path.isabs(path):
            return os.path.relpath(path, self._directory)
        return path

    def _sweep(self) -> None:
        """Keeps the newest `keep` checkpoints and the one the evaluator pinned; deletes the rest.

        The kept list (with its timestamps, which a later CheckpointManager needs to go on
        sweeping) is written to model_dir's ``checkpoint`` file before any file is
        deleted, so a reader never finds a listed checkpoint missing. A slow evaluator
        costs one checkpoint's space, not one per checkpoint saved while it evaluates.
        """
        state = tf.train.get_checkpoint_state(self._directory)
        listed = list(state.all_model_checkpoint_paths)
        stamps = list(state.all_model_checkpoint_timestamps)
        name = pinned(self.model_dir)
        newest_kept = listed[-self._keep :]
        spared = [p for p in listed if _basename(p) == name and p not in newest_kept]
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
        _write_checkpoint_list(
            self._directory,
            self._entry(state.model_checkpoint_path),
            paths=[self._entry(listed[i]) for i in kept],
            timestamps=[stamps[i] for i in kept] if stamps else None,
            last_preserved_timestamp=state.last_preserved_timestamp,
        )
        for i, prefix in enumerate(listed):
            if i not in kept:
                for file in checkpoint_files(prefix):
                    storage.remove(file)


def _write_checkpoint_list(
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
