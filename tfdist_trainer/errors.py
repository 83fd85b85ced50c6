"""The errors a task can end with, and the exit code each one means. Imports nothing heavy.

Every error the package raises on purpose is a `TfdistError`: its message is
one sentence that names the fix, and `tfdist-train` prints it without a
traceback and exits with its `exit_code`. Anything else (a bug in a user's
Trainer, say) keeps its full traceback.

Exit codes follow Kubeflow's ExitCode restart policy: 1-127 are permanent
(restarting cannot help), 128-255 are retryable (a signal, a preemption, a
lost peer).
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_FAILED = 1  # training itself failed (NaN loss, a bug)
EXIT_CONFIG = 2  # the user's configuration or cluster is wrong
EXIT_STORAGE = 3  # model_dir's storage refused a write: full, read-only, no permission, a path gone
EXIT_PREEMPTED = 143  # SIGTERM, after a checkpoint
EXIT_PEER_LOST = (
    200  # a ps or peer worker died, or the parameter_server chief's watchdog saw workers go silent
)
EXIT_CHIEF_LOST = (
    201  # a serving ps/worker gave up on a chief that vanished without marking training done
)
EXIT_STORAGE_UNAVAILABLE = (
    202  # model_dir's storage did not answer (an object store's 503, a timeout)
)

#: The name of an in-graph assertion that checks a setting against data (runtime/config_checks.py):
#: when it fails, the task says its message and exits EXIT_CONFIG.
CONFIG_CHECK = "tfdist_config_check"

#: Exit codes no restart can fix; every other non-zero code is worth a restart.
PERMANENT_EXIT_CODES = range(1, 128)


def is_retryable(code: int) -> bool:
    """Whether a restart may help a task that exited with `code` (Kubeflow's ExitCode rule: 128-255)."""
    return 128 <= code <= 255


def exit_code(returncode: int) -> int:
    """A shell-style exit code from a Popen returncode: killed by signal N reads 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class TfdistError(Exception):
    """Base of the package's own errors: a one-sentence message and the task's exit code."""

    exit_code: int = EXIT_FAILED
    #: End the process without interpreter shutdown (threads blocked in TF would keep it alive).
    hard_exit: bool = False
    # Raised inside a layer's call in a traced step (a DynamicEmbedding's key check), the error
    # must reach the task as it was raised, to be one sentence and its exit code. Keras' call
    # wrapper re-raises any other error with its arguments' dump prepended (ANSI codes and
    # all), and AutoGraph turns errors of classes it does not know into a StagingError (exit 1,
    # a traceback): both leave an error alone that has these attributes (Keras 3
    # traceback_utils, TF autograph/impl/api.py; tests/test_tf_compat.py checks both).
    _keras_call_info_injected = True
    ag_pass_through = True


class ConfigError(TfdistError, ValueError):
    """The gin configuration, a flag or a module given by the user is wrong."""

    exit_code = EXIT_CONFIG


class ClusterConfigError(ConfigError):
    """The cluster description (TF_CONFIG or the classic flags) cannot work."""


class StorageError(TfdistError, OSError):
    """A path under model_dir cannot be used; the message is one sentence fragment."""


class CheckpointWriteError(StorageError):
    """A checkpoint could not be written (full disk, no permission, read-only, a path gone).

    Permanent: a restarted task would fill the same disk or meet the same
    permission, so a person must act first (Kubeflow's ExitCode policy does not retry 3).
    """

    exit_code = EXIT_STORAGE


class StorageUnavailable(StorageError):
    """model_dir's storage did not answer a checkpoint write in time; a restart may well succeed."""

    exit_code = EXIT_STORAGE_UNAVAILABLE


class NoIntactCheckpoint(StorageError):
    """Every checkpoint model_dir lists is damaged or missing; resuming needs a person's choice.

    Exit 2, not retried: a restart would meet the same files; the files stay as
    they are, so that a person can restore copies or choose to start again.
    """

    exit_code = EXIT_CONFIG


class NonFiniteLossError(TfdistError, RuntimeError):
    """The loss became NaN or Inf; no checkpoint holds that state."""


class EvaluatorTimeout(TfdistError, TimeoutError):
    """The evaluator side-car saw no new checkpoint for too long."""


class Preempted(TfdistError):
    """SIGTERM arrived; a checkpoint was saved and the task exits so that it can be restarted."""

    exit_code = EXIT_PREEMPTED


class PeerLost(TfdistError):
    """TensorFlow lost contact with another task (a ps, a peer worker): a restart from the checkpoint fixes it."""

    exit_code = EXIT_PEER_LOST


class ChiefLost(TfdistError):
    """A serving task saw the chief vanish before it marked training done."""

    exit_code = EXIT_CHIEF_LOST


class ClusterStalledError(TfdistError):
    """No scheduled closure finished within the deadline; `silent` names the stuck workers.

    The task must end without interpreter shutdown: TF threads blocked on the
    silent peer would keep the process alive forever.
    """

    exit_code = EXIT_PEER_LOST
    hard_exit = True

    def __init__(self, message: str, silent: Sequence[int]):
        super().__init__(message)
        self.silent = list(silent)
