"""tfdist_trainer.io in process: the done marker, metrics records, storage writes and atomic directories.

Runs through a model_dir in one process and through the launcher are in tests/test_storage.py.
"""

from __future__ import annotations

import os
import uuid

import pytest

from tfdist_trainer.io import markers, storage
from tfdist_trainer.io.records import MetricsRecord, read_records


def test_done_marker_from_an_older_run_is_ignored(tmp_path):
    model_dir = f"file://{tmp_path}"
    assert markers.done_run_id(model_dir) is None and markers.done_step(model_dir) is None
    markers.mark_done(model_dir, 30)  # an older run finished at step 30
    # what a serving task of the next run sees when it starts
    stale = markers.done_run_id(model_dir)
    assert stale and markers.done_step(model_dir) == 30
    assert not markers.done_since(model_dir, stale)
    markers.clear_done(model_dir)  # the restarted chief clears it
    assert markers.done_step(model_dir) is None and not markers.done_since(model_dir, stale)
    markers.mark_done(model_dir, 60)  # this run is done
    assert markers.done_since(model_dir, stale) and markers.done_step(model_dir) == 60
    assert markers.done_since(model_dir, None)  # a task that started after the clear
    # The marker holds an id and the step, not a time: the same step again is still a new marker.
    markers.mark_done(model_dir, 60)
    assert markers.done_since(model_dir, markers.done_run_id(model_dir)) is False
    legacy = tmp_path / markers.DONE_FILE
    legacy.write_text("30")  # written by an older version: a step only
    assert markers.done_step(model_dir) == 30 and markers.done_run_id(model_dir) == ""


def test_metrics_record_rewrites_and_keeps_history():
    path = f"ram://tfdist-{uuid.uuid4().hex[:8]}/eval/metrics.jsonl"
    first = MetricsRecord(path)
    first.write(kind="train", step=1)
    first.write(kind="train", step=2)
    MetricsRecord(path).write(kind="train", step=3)  # a restarted chief keeps the history
    assert [r["step"] for r in read_records(path)] == [1, 2, 3]
    assert storage.listdir(storage.dirname(path)) == ["metrics.jsonl"]


def test_storage_write_text_is_whole_and_local_helpers(tmp_path):
    path = storage.join(f"file://{tmp_path}", "a", "b.txt")
    storage.makedirs(storage.dirname(path), private=True)
    assert oct(os.stat(tmp_path / "a").st_mode & 0o777) == oct(0o700)
    storage.write_text(path, "one")
    storage.write_text(path, "two")
    assert storage.read_text(path) == "two" and storage.read_text(path + ".missing") is None
    assert os.listdir(tmp_path / "a") == ["b.txt"]
    storage.rmtree(storage.join(f"file://{tmp_path}", "a"))
    storage.rmtree(storage.join(f"file://{tmp_path}", "a"))  # gone already: fine
    assert not (tmp_path / "a").exists()
    with pytest.raises(storage.StorageError, match="tensorflow-io"):
        storage.exists("s3://bucket/run")


def test_storage_atomic_directory(tmp_path):
    """The whole directory appears at once (renamed from a .tmp-* sibling), replaces an older one,
    and a block that fails leaves nothing behind."""
    from tfdist_trainer.io import storage

    root = f"file://{tmp_path}"
    path = storage.join(root, "exports", "7")
    with storage.atomic_directory(path) as target:
        assert ".tmp-7-" in target and not storage.exists(path)
        storage.write_json(storage.join(target, "r.json"), {"step": 7})
    with storage.atomic_directory(path) as target:
        storage.write_json(storage.join(target, "r.json"), {"step": 8})
    assert storage.read_json(storage.join(path, "r.json")) == {"step": 8}
    assert os.listdir(tmp_path / "exports") == ["7"]
    with (
        pytest.raises(RuntimeError, match="half-way"),
        storage.atomic_directory(storage.join(root, "exports", "9")) as target,
    ):
        storage.write_text(storage.join(target, "part"), "x")
        raise RuntimeError("half-way")
    assert os.listdir(tmp_path / "exports") == ["7"]
    assert storage.read_json(storage.join(root, "missing.json")) is None
    storage.write_text(storage.join(root, "torn.json"), '{"step": ')
    assert storage.read_json(storage.join(root, "torn.json")) is None
    storage.rename(storage.join(root, "exports"), storage.join(root, "moved"))
    assert sorted(os.listdir(tmp_path)) == ["moved", "torn.json"]
    assert storage.has_atomic_rename(root) and not storage.has_atomic_rename("gs://b/run")
