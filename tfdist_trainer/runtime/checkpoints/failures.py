"""What a failed checkpoint read or write means, in one sentence.

TensorFlow reports a damaged file, a full disk and a lost parameter server
with the same few exception types and long decorated messages. Restoring
must skip a damaged checkpoint but never mistake a lost ps or another model
for one; saving must end a task whose storage refuses a write with the fix,
not a traceback. The tests (tests/unit/test_checkpoint_fallback.py) pin the
messages measured on TF 2.21.
"""

from __future__ import annotations

import re

import tensorflow as tf

from tfdist_trainer.errors import (
    CheckpointWriteError,
    ConfigError,
    StorageUnavailable,
    TfdistError,
)
from tfdist_trainer.sharding import runtime_api as tables

#: TF's decorations of an op's error: ``{{function_node ...}}``, ``[[{{node RestoreV2}}]]``,
#: ``[Op:SaveV2]``.
_DECORATIONS = re.compile(r"\{\{[^}]*\}\}|\[\[.*?\]\]|\[Op:[^\]]*\]")

#: What TF appends to a function's ResourceExhaustedError (a full disk too): not its cause.
_OOM_HINT = "Hint: If you want to see a list of allocated tensors when OOM happens"

#: An error of several tasks: ``2 root error(s) found.``, then ``(0) RESOURCE_EXHAUSTED: <cause>``.
_ROOT_ERRORS = re.compile(r"\d+ root error\(s\) found")
_ROOT_ERROR = re.compile(r"\(\d+\) [A-Z_]+: (.*)")


def one_line(error: BaseException) -> str:
    """TF's message in one line, without its decorations. An error of several tasks says ``N
    root error(s) found.``, then each: the first is the cause (also inside a function's error,
    as a lost ps reaches the parameter_server chief). A function's error (under parameter_server
    the restore and the traced write are functions) starts with ``Graph execution error:`` and
    the place it was defined; its cause is its last line (before TF's hint on out-of-memory
    errors, which a full disk's error in a function carries too)."""
    text = getattr(error, "message", None) or str(error)
    lines = [_DECORATIONS.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_OOM_HINT)]
    if not lines:
        return type(error).__name__
    if any(_ROOT_ERRORS.match(line) for line in lines):
        causes = [m.group(1).strip() for m in map(_ROOT_ERROR.match, lines) if m]
        if causes and causes[0]:
            return causes[0][:300]
    if lines[0] == "Graph execution error:":
        return lines[-1][:300]
    return lines[0][:300]


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
        return f"{type(error).__name__}: {one_line(error)}"
    return None


def model_mismatch(
    prefix: str, error: BaseException, what: str, restoring: tf.train.Checkpoint
) -> ConfigError:
    """One sentence for a checkpoint that is not of this model (`restoring`, the checkpoint object
    that failed): tables of the other kind by name, else the error's first line. `error` is
    TensorFlow's AssertionError (some of the model's objects it holds no values for) or the
    error of a variable of another shape (TF's InvalidArgumentError, Keras' ValueError)."""
    specific = tables.table_kind_mismatch(prefix, restoring)
    if specific:
        return ConfigError(specific)
    text = str(error).strip() if isinstance(error, AssertionError) else one_line(error)
    first = text.splitlines()[0][:200] if text else type(error).__name__
    return ConfigError(
        f"{prefix} is not a checkpoint of {what} ({first}); point --model_dir (or --checkpoint) "
        f"at a run of the same model and gin config."
    )


def save_failure(error: tf.errors.OpError, path: str, *, unavailable: bool) -> TfdistError | None:
    """The one-sentence error for a checkpoint write the storage refused, or None for another
    failure. `unavailable`: a storage that does not answer is told apart from a lost peer
    (only a task alone can be sure; elsewhere TF's lost-peer errors look the same)."""
    cause = one_line(error).rsplit("; ", 1)[-1]
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
