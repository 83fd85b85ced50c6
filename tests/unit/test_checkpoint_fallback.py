"""In process: Checkpointer.restore skips a damaged newest checkpoint; a refused save is one line.

Real TF checkpoints of a tiny Keras model, damaged the way a full disk or an
interrupted copy leaves them (truncated, a missing index, flipped bytes), under
a ``file://`` model_dir so that any stray `os` call on it fails. The CLI runs,
under one_device and parameter_server, are in tests/test_checkpoint_faults.py.
"""

from __future__ import annotations

import os

import keras
import pytest
import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import (
    EXIT_CONFIG,
    EXIT_STORAGE,
    EXIT_STORAGE_UNAVAILABLE,
    CheckpointWriteError,
    NoIntactCheckpoint,
    StorageUnavailable,
)
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.runtime import checkpoints
from tfdist_trainer.runtime.checkpoints import Checkpointer, failures


def make_checkpointer(
    model_dir: str, *, units: int = 8, keep: int = 5, background: bool = False
) -> Checkpointer:
    """A Checkpointer of a lone task over a small model, Adam's slots built (as in build_state)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=step)
    return Checkpointer(
        model_dir=model_dir,
        cluster=ClusterConfig(cluster={}),
        checkpoint=checkpoint,
        global_step=step,
        keep=keep,
        background=background,
    )


@pytest.fixture
def saved(tmp_path):
    """A model_dir (local path, file:// URI) holding ckpt-100 and ckpt-200."""
    local = str(tmp_path / "run")
    checkpointer = make_checkpointer(f"file://{local}")
    for step in (100, 200):
        checkpointer.global_step.assign(step)
        checkpointer.save(step)
    return local, f"file://{local}"


def data_file(local: str, step: int) -> str:
    (name,) = [n for n in os.listdir(local) if n.startswith(f"ckpt-{step}.data-")]
    return os.path.join(local, name)


def truncate(local: str) -> None:
    path = data_file(local, 200)
    os.truncate(path, os.path.getsize(path) // 2)


def remove_index(local: str) -> None:
    os.remove(os.path.join(local, "ckpt-200.index"))


def flip_bytes(local: str) -> None:
    path = data_file(local, 200)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        chunk = f.read(16)
        f.seek(-len(chunk), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in chunk))


def listed(local: str) -> list[str]:
    state = tf.train.get_checkpoint_state(local)
    return [os.path.basename(p) for p in state.all_model_checkpoint_paths]


@pytest.fixture
def warnings_said(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(logging, "warning", lambda msg, *args: said.append(msg % args))
    return said


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (truncate, "IndexError: Read less bytes than requested"),
        (remove_index, "its .index file is missing"),
        (flip_bytes, "Checksum does not match"),
    ],
)
def test_a_damaged_newest_is_skipped_and_set_aside(saved, warnings_said, damage, reason):
    local, uri = saved
    damage(local)
    checkpointer = make_checkpointer(uri)
    assert checkpointer.restore() == 100
    assert len(warnings_said) == 1, warnings_said
    assert "ckpt-200" in warnings_said[0] and reason in warnings_said[0], warnings_said[0]
    assert listed(local) == ["ckpt-100"]
    assert os.path.basename(tf.train.latest_checkpoint(local)) == "ckpt-100"
    names = os.listdir(local)
    assert not [n for n in names if n.startswith("ckpt-200.") and ".corrupt-" not in n], names
    aside = sorted(n for n in names if ".corrupt-" in n)
    assert aside, names
    assert all(n.startswith("ckpt-200.corrupt-") for n in aside), aside
    # the next start restores ckpt-100 at once, with nothing to say
    again = make_checkpointer(uri)
    assert again.restore() == 100
    assert len(warnings_said) == 1


def test_training_on_saves_the_same_step_again_and_its_sweep_keeps_the_files_set_aside(saved):
    local, uri = saved
    truncate(local)
    checkpointer = make_checkpointer(uri, keep=1)
    assert checkpointer.restore() == 100
    for step in (200, 300):
        checkpointer.global_step.assign(step)
        checkpointer.save(step)
    assert listed(local) == ["ckpt-300"]  # ckpt-200 (the new one) swept...
    names = os.listdir(local)
    assert [n for n in names if ".corrupt-" in n], names  # ...but not the damaged one set aside
    assert "ckpt-200.index" not in names


def test_no_intact_checkpoint_is_one_sentence_and_moves_nothing(saved):
    local, uri = saved
    truncate(local)
    os.truncate(data_file(local, 100), 10)
    before = sorted(os.listdir(local))
    with pytest.raises(NoIntactCheckpoint) as raised:
        make_checkpointer(uri).restore()
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_CONFIG
    assert "\n" not in message
    assert "ckpt-200: IndexError" in message and "ckpt-100: IndexError" in message, message
    assert "from step 0" in message
    assert sorted(os.listdir(local)) == before
    assert listed(local) == ["ckpt-100", "ckpt-200"]


def test_a_checkpoint_of_another_model_is_not_taken_for_a_damaged_one(saved):
    local, uri = saved
    with pytest.raises(Exception) as raised:  # noqa: PT011  TF's own error, whatever its type
        make_checkpointer(uri, units=5).restore()
    assert not isinstance(raised.value, NoIntactCheckpoint)
    assert checkpoints.unreadable_reason(raised.value) is None
    assert listed(local) == ["ckpt-100", "ckpt-200"]
    assert not [n for n in os.listdir(local) if ".corrupt-" in n]


def test_lost_peers_and_bugs_are_not_damage():
    assert checkpoints.unreadable_reason(tf.errors.UnavailableError(None, None, "gone")) is None
    assert checkpoints.unreadable_reason(ValueError("shape")) is None
    gone = "Resource localhost/_AnonymousVar12/N10tensorflow3VarE does not exist."
    assert checkpoints.unreadable_reason(tf.errors.NotFoundError(None, None, gone)) is None
    reason = checkpoints.unreadable_reason(tf.errors.DataLossError(None, None, "bad crc"))
    assert reason == "DataLossError: bad crc"


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_a_refused_save_is_one_sentence_and_leaves_the_previous_checkpoint_listed(
    saved, background
):
    local, uri = saved
    checkpointer = make_checkpointer(uri, background=background)
    checkpointer.restore()  # (it removes ckpt-*_temp leftovers)
    # A file where the save's temporary directory goes: SaveV2 fails ("Not a directory").
    with open(os.path.join(local, "ckpt-300_temp"), "w"):
        pass
    checkpointer.global_step.assign(300)
    with pytest.raises(CheckpointWriteError) as raised:
        checkpointer.save(300)  # a background save fails on its thread: wait() raises it
        checkpointer.wait()
    message = str(raised.value)
    assert raised.value.exit_code == EXIT_STORAGE
    assert "\n" not in message and "{{" not in message and "[Op:" not in message, message
    assert f"{uri}/ckpt-300: Not a directory (FailedPreconditionError)" in message, message
    assert "ckpt-300_temp" not in os.listdir(local)
    assert listed(local) == ["ckpt-100", "ckpt-200"]


@pytest.mark.parametrize(
    ("error", "alone", "expected"),
    [
        (tf.errors.ResourceExhaustedError(None, None, "/d/x.tempstate1; No space left on device"),
         False, CheckpointWriteError),
        (tf.errors.PermissionDeniedError(None, None, "/d/x; Read-only file system"), False,
         CheckpointWriteError),
        (tf.errors.UnavailableError(None, None, "503"), True, StorageUnavailable),
        (tf.errors.UnavailableError(None, None, "Socket closed"), False, None),
        (tf.errors.InvalidArgumentError(None, None, "a bug"), True, None),
    ],
)  # fmt: skip
def test_what_each_save_failure_becomes(error, alone, expected):
    result = failures.save_failure(error, "/d/ckpt-300", unavailable=alone)
    if expected is None:
        assert result is None
        return
    assert isinstance(result, expected)
    if expected is CheckpointWriteError:
        assert result.exit_code == EXIT_STORAGE
        assert str(result).startswith(
            f"could not save checkpoint /d/ckpt-300: {error.message.rsplit('; ')[-1]}"
        )
    else:
        assert result.exit_code == EXIT_STORAGE_UNAVAILABLE


@pytest.mark.parametrize("keep_chars", [0, 40], ids=["empty", "torn"])
def test_a_damaged_checkpoint_file_is_rebuilt_from_the_checkpoints_beside_it(saved, keep_chars):
    """TF alone would say a warning and train again from step 0 (torn), or fail (empty)."""
    local, uri = saved
    listing = os.path.join(local, "checkpoint")
    with open(listing) as f:
        text = f.read()
    with open(listing, "w") as f:
        f.write(text[:keep_chars])
    assert make_checkpointer(uri).restore() == 200
    assert listed(local) == ["ckpt-100", "ckpt-200"]
    truncate(local)  # and a damaged newest on top is set aside as usual
    with open(listing, "w") as f:
        f.write(text[:keep_chars])
    assert make_checkpointer(uri).restore() == 100
    assert listed(local) == ["ckpt-100"]


def test_the_evaluator_skips_a_damaged_checkpoint_without_failing(saved, monkeypatch):
    from tfdist_trainer.runtime import evaluate

    local, uri = saved
    truncate(local)
    monkeypatch.setattr(evaluate.time, "sleep", lambda s: None)
    checkpointer = make_checkpointer(uri)
    read = evaluate._read(checkpointer._checkpoint, f"{uri}/ckpt-200", uri, by="evaluator")
    assert read is False
    assert evaluate._read(checkpointer._checkpoint, f"{uri}/ckpt-100", uri, by="evaluator")


#: A lost ps as the parameter_server chief gets it (a chief's log in the chaos test, abridged).
LOST_PS = (
    "Graph execution error:\n\n2 root error(s) found.\n  (0) UNAVAILABLE:  failed to "
    "connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28462: Failed to connect"
    " to remote host: Connection refused\nAdditional GRPC error information from remote "
    "target /job:ps/replica:0/task:0/device:CPU:0 while calling /tensorflow.eager."
    "EagerService/RunComponentFunction:\n:UNKNOWN:Error received from peer  {grpc_status:14}"
    "\n  (1) CANCELLED:  Function was cancelled before it was started\n0 successful "
    "operations.\n0 derived errors ignored.\nAdditional GRPC error information from remote"
    " target /job:worker/replica:0/task:1 while calling /tensorflow.eager.EagerService/"
    "Enqueue:\n:UNKNOWN:Error received from peer  {grpc_status:14}"
)
LOST_PS_CAUSE = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:28462: Failed "
    "to connect to remote host: Connection refused"
)


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        ("{{function_node __wrapped__SaveV2_dtypes_5_device_/job:localhost/replica:0/task:0/"
         "device:CPU:0}} /d/ckpt-4_temp/part; No space left on device [Op:SaveV2]",
         "/d/ckpt-4_temp/part; No space left on device"),
        ("Graph execution error:\n\nDetected at node RestoreV2 defined at (most recent call "
         "last):\n  File \"x.py\", line 7, in <module>\n\nRead less bytes than requested\n\t "
         "[[{{node RestoreV2}}]] [Op:__inference_f_264]",
         "Read less bytes than requested"),
        ("2 root error(s) found.\n  (0) RESOURCE_EXHAUSTED: /d/ckpt-200_temp/part-00000-of-00003"
         "; No space left on device\n\t [[{{node SaveV2}}]]\nHint: ...\n  (1) RESOURCE_EXHAUSTED:"
         " same\n0 successful operations.",
         "/d/ckpt-200_temp/part-00000-of-00003; No space left on device"),
        (LOST_PS, LOST_PS_CAUSE),
    ],
    ids=["op", "function", "several-tasks", "function-of-several-tasks"],
)  # fmt: skip
def test_tf_messages_become_their_cause_in_one_line(message, cause):
    assert failures.one_line(tf.errors.OpError(None, None, message, 2)) == cause


def test_a_lost_peer_is_one_sentence_with_the_cause_from_tf_s_message():
    from tfdist_trainer.errors import PeerLost
    from tfdist_trainer.runtime.peers import lost_peer_is_one_error

    with pytest.raises(PeerLost) as raised, lost_peer_is_one_error():
        raise tf.errors.UnavailableError(None, None, LOST_PS)
    assert str(raised.value) == (
        f"lost contact with another task of the cluster (UnavailableError: {LOST_PS_CAUSE}); "
        "restart it and this task to resume from the last checkpoint."
    )
