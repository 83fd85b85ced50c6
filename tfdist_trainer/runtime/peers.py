"""A lost peer, said once: TensorFlow's errors for a task that went away become `PeerLost`.

A ps under parameter_server, or a peer under multi_worker_mirrored, that dies
surfaces as one of several TF errors, from a step, a collective or a save,
with a message of TF's internals. Each task's action runs inside
`lost_peer_is_one_error`, so the task ends with one sentence and the
retryable exit code 200 whatever raised it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from tfdist_trainer.errors import PeerLost
from tfdist_trainer.runtime.checkpoints.failures import one_line

#: Errors that mean another task of the cluster is gone (a ps under parameter_server,
#: a peer under multi_worker_mirrored); restarting the job from its checkpoint fixes them.
PEER_LOST_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)


@contextlib.contextmanager
def lost_peer_is_one_error() -> Iterator[None]:
    """Re-raises TF's lost-peer errors as `PeerLost` with the cause in TF's message."""
    try:
        yield
    except PEER_LOST_ERRORS as e:
        raise PeerLost(
            f"lost contact with another task of the cluster ({type(e).__name__}: {one_line(e)}); "
            f"restart it and this task to resume from the last checkpoint."
        ) from None
