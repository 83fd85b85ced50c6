"""Files in model_dir through which the tasks of a job tell each other things.

* ``training_done`` (the chief): how side-cars and serving tasks learn the
  job is over. It holds a fresh run id and the final step, as JSON. Serving
  tasks tell a new marker from an older run's by the id, never by comparing
  the file's time with their own clock (object stores have no reliable
  mtime, and hosts' clocks differ).
* ``preempted-<type>-<index>`` (a preempted ps) and ``preemption_saved``
  (the chief's answer): a ps that got SIGTERM asks the chief to save the
  variables it holds before it exits; the answer names the step saved and
  the requests it answers (tfdist_trainer.runtime.preemption).

Everything goes through tfdist_trainer.io.storage, so gs:// and s3:// work;
TensorFlow is imported only when a marker is read or written there.
"""

from __future__ import annotations

import json
import uuid

from tfdist_trainer.io import storage

DONE_FILE = "training_done"
SAVE_REQUEST_PREFIX = "preempted-"
SAVED_FILE = "preemption_saved"
#: How long a preempted ps waits for the chief's answer by default (tfdist-train
#: --preemption_grace_s); the pods' grace period (tfdist-launch --k8s_grace_s) must exceed it.
DEFAULT_PREEMPTION_GRACE_S = 25.0


def clear_done(model_dir: str) -> None:
    """Deletes the done marker: a (re)started chief says training goes on, so side-cars keep following."""
    storage.remove(storage.join(model_dir, DONE_FILE))


def mark_done(model_dir: str, step: int) -> None:
    """The chief tells side-cars that no checkpoint after `step` will come.

    The marker holds a fresh run id and the step, as JSON: serving tasks tell
    a new marker from an older run's by the id, never by comparing the file's
    time with their own clock (object stores have no reliable mtime, and hosts'
    clocks differ).
    """
    storage.write_text(
        storage.join(model_dir, DONE_FILE),
        json.dumps({"run_id": uuid.uuid4().hex, "step": int(step)}) + "\n",
    )


def read_marker(model_dir: str) -> dict | None:
    """The done marker as {"run_id", "step"}, or None when there is none (or it cannot be read)."""
    try:
        text = storage.read_text(storage.join(model_dir, DONE_FILE))
    except OSError:  # StorageError included: an unreachable file system says nothing about the job
        return None
    if text is None:
        return None
    try:
        marker = json.loads(text)
        # an older version wrote the bare step: an old run by definition
        if isinstance(marker, int):
            return {"run_id": "", "step": marker}
        return {"run_id": str(marker["run_id"]), "step": int(marker["step"])}
    except (ValueError, TypeError, KeyError):
        return None


def done_run_id(model_dir: str) -> str | None:
    marker = read_marker(model_dir)
    return marker["run_id"] if marker else None


def done_since(model_dir: str, stale: str | None) -> bool:
    """Whether the chief marked training done, other than in `stale` (the run id seen at start: an older run)."""
    run_id = done_run_id(model_dir)
    return run_id is not None and run_id != stale


def done_step(model_dir: str) -> int | None:
    """The step at which the chief marked training done, or None."""
    marker = read_marker(model_dir)
    return marker["step"] if marker else None


# -- preemption of a ps: a save request and the chief's answer -----------------------------------


def request_save(model_dir: str, role: str) -> str:
    """A preempted task (`role`, e.g. 'ps:0') asks the chief to save a checkpoint; returns the request id."""
    request_id = uuid.uuid4().hex
    name = SAVE_REQUEST_PREFIX + role.replace(":", "-")
    storage.write_text(
        storage.join(model_dir, name), json.dumps({"task": role, "request_id": request_id}) + "\n"
    )
    return request_id


def save_requests(model_dir: str) -> list[dict]:
    """The pending save requests, each {"task", "request_id"}; [] when none (or none can be read)."""
    try:
        paths = storage.glob(storage.join(model_dir, SAVE_REQUEST_PREFIX + "*"))
    except OSError:  # an unreachable file system asks for nothing
        return []
    requests = []
    for path in sorted(paths):
        if ".tmp-" in path:  # a request being written (storage.write_text's temporary file)
            continue
        try:
            request = json.loads(storage.read_text(path) or "")
            requests.append(
                {"task": str(request["task"]), "request_id": str(request["request_id"])}
            )
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return requests


def answer_save_requests(model_dir: str, requests: list[dict], step: int) -> None:
    """The chief says that a checkpoint at `step` holds what `requests` asked to be saved."""
    storage.write_text(
        storage.join(model_dir, SAVED_FILE),
        json.dumps({"step": int(step), "request_ids": [r["request_id"] for r in requests]}) + "\n",
    )


def saved_step(model_dir: str, request_id: str) -> int | None:
    """The step the chief saved in answer to `request_id`, or None (not yet, or not this request)."""
    try:
        answer = json.loads(storage.read_text(storage.join(model_dir, SAVED_FILE)) or "")
        if request_id in answer["request_ids"]:
            return int(answer["step"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return None


def clear_save_requests(model_dir: str) -> None:
    """A (re)starting chief removes an earlier run's requests and answer: their ps tasks are gone."""
    for path in storage.glob(storage.join(model_dir, SAVE_REQUEST_PREFIX + "*")):
        storage.remove(path)
    storage.remove(storage.join(model_dir, SAVED_FILE))
