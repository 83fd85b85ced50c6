"""A job that runs for days: a damaged checkpoint is skipped, a full disk is one sentence.

Real `tfdist-train` / `tfdist-launch` runs of the tiny MNIST CNN: a run saves
ckpt-100 and ckpt-200, the test damages ckpt-200 as a full disk or an
interrupted copy leaves it, and the same command, run again, resumes from
ckpt-100 with one warning, sets ckpt-200 aside and ends at its exact final
step. The full disk is a real, small tmpfs (the tests run as root; skipped
where mounting is refused). In-process cases: tests/unit/test_checkpoint_fallback.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from clusterlib import (
    FAST_MNIST,
    assert_one_error_line,
    launch_cmd,
    read_records,
    run,
    strategy_gin,
    train_cmd,
)

from tfdist_trainer.errors import EXIT_CONFIG, EXIT_STORAGE
from tfdist_trainer.io.checkpoint_names import latest_step

TIMEOUT_S = 240
STEPS = [
    "--gin_bindings=train.train_steps=200",
    "--gin_bindings=train.checkpoint_every_n_steps=100",
]


def train_args(model_dir: str, strategy: str = "one_device", *extra: str) -> list[str]:
    return [*FAST_MNIST, strategy_gin(strategy), f"--model_dir={model_dir}", *STEPS, *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    """A one_device model_dir holding ckpt-100 and ckpt-200, trained once for the module."""
    model_dir = str(tmp_path_factory.mktemp("trained") / "run")
    result = run(train_cmd(*train_args(model_dir)), timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-5000:]
    return model_dir


# -- damage, as a full disk or an interrupted copy leaves it ---------------------------------


def data_files(model_dir: str, step: int) -> list[str]:
    names = sorted(n for n in os.listdir(model_dir) if n.startswith(f"ckpt-{step}.data-"))
    return [os.path.join(model_dir, n) for n in names]


def truncate(model_dir: str, step: int = 200) -> None:
    """Half of the largest data file, as a copy that ran out of space leaves it."""
    path = max(data_files(model_dir, step), key=os.path.getsize)
    os.truncate(path, os.path.getsize(path) // 2)


def remove_index(model_dir: str, step: int = 200) -> None:
    os.remove(os.path.join(model_dir, f"ckpt-{step}.index"))


def flip_bytes(model_dir: str, step: int = 200) -> None:
    """16 bytes in the middle of the largest data file inverted: only TF's CRC can tell."""
    path = max(data_files(model_dir, step), key=os.path.getsize)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        chunk = f.read(16)
        f.seek(-len(chunk), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in chunk))


# -- what a resumed job must show ------------------------------------------------------------


def files_of(model_dir: str, name: str) -> set[str]:
    """The suffixes (``.index``, ``.data-00000-of-00001``) of checkpoint `name`'s files."""
    return {n[len(name) :] for n in os.listdir(model_dir) if n.startswith(f"{name}.")}


def assert_resumed_past(
    result: subprocess.CompletedProcess, model_dir: str, reason: str, damaged: set[str]
) -> None:
    """Exit 0 after one warning naming ckpt-200 and `reason`; the `damaged` files of ckpt-200
    renamed aside; step 200 reached."""
    output = result.stdout
    assert result.returncode == 0, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    warnings = [line for line in output.splitlines() if "cannot be read (" in line]
    assert len(warnings) == 1, output[-5000:]
    assert "ckpt-200" in warnings[0] and reason in warnings[0], warnings[0]
    assert "resumed from ckpt-100 (step 100)" in warnings[0], warnings[0]
    assert "/ckpt-100 (step 100)" in output  # the "restored ..." line
    (aside,) = {n.rsplit(".", 1)[0] for n in os.listdir(model_dir) if ".corrupt-" in n}
    assert aside.startswith("ckpt-200.corrupt-"), aside
    assert files_of(model_dir, aside) == damaged
    assert latest_step(model_dir) == 200  # a new ckpt-200, saved by the resumed run
    assert read_records(model_dir)[-1]["step"] == 200
    train = [r for r in read_records(model_dir) if r.get("kind") == "train"]
    assert train[-1]["step"] == 200
    with open(os.path.join(model_dir, "training_done")) as f:
        assert json.load(f)["step"] == 200


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        # TF names the short read IndexError or OutOfRangeError, by which file is cut short
        (truncate, "Read less bytes than requested"),
        (remove_index, "its .index file is missing"),
        (flip_bytes, "Checksum does not match"),
    ],
    ids=["truncated-data", "missing-index", "flipped-bytes"],
)
def test_one_device_resumes_from_the_checkpoint_before_a_damaged_one(
    trained, tmp_path, damage, reason
):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    damage(model_dir)
    damaged = files_of(model_dir, "ckpt-200")
    result = run(train_cmd(*train_args(model_dir)), timeout=TIMEOUT_S)
    assert_resumed_past(result, model_dir, reason, damaged)


def test_no_readable_checkpoint_is_one_sentence_and_exit_2(trained, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(trained, model_dir)
    truncate(model_dir, 200)
    truncate(model_dir, 100)
    before = sorted(os.listdir(model_dir))
    result = run(train_cmd(*train_args(model_dir)), timeout=TIMEOUT_S)
    assert_one_error_line(
        result,
        EXIT_CONFIG,
        "no checkpoint listed in",
        "ckpt-200: ",
        "ckpt-100: ",
        "Read less bytes than requested",
    )
    assert sorted(os.listdir(model_dir)) == before  # nothing moved: a person chooses
    assert latest_step(model_dir) == 200


def test_parameter_server_resumes_from_the_checkpoint_before_a_truncated_one(tmp_path):
    """The chief's checkpoint of variables on a ps, written through one traced write."""
    model_dir = str(tmp_path / "run")
    cmd = launch_cmd(["--num_workers=2", "--num_ps=1"], train_args(model_dir, "parameter_server"))
    first = run(cmd, timeout=TIMEOUT_S)
    assert first.returncode == 0, first.stdout[-5000:]
    truncate(model_dir)
    damaged = files_of(model_dir, "ckpt-200")
    assert len(damaged) > 2, damaged  # an index and one data file per task holding variables
    result = run(cmd, timeout=TIMEOUT_S)
    assert_resumed_past(result, model_dir, "Read less bytes than requested", damaged)
    assert "[chief:0]" in next(
        line for line in result.stdout.splitlines() if "cannot be read (" in line
    )


# -- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs, unmounted after the test; skipped where mounting is refused."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs root, CAP_SYS_ADMIN): {e}")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def fill(disk: str, leave: int) -> None:
    """Writes a file that leaves `leave` bytes free on `disk`."""
    stat = os.statvfs(disk)
    with open(os.path.join(disk, "filler"), "wb") as f:
        f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - leave))


def test_a_full_disk_ends_the_task_with_one_sentence_and_keeps_the_previous_checkpoint(
    small_disk,
):
    model_dir = os.path.join(small_disk, "run")
    extra = ["--gin_bindings=train.keep_checkpoints=100"]
    first = run(
        train_cmd(*train_args(model_dir), "--gin_bindings=train.train_steps=100", *extra),
        timeout=TIMEOUT_S,
    )
    assert first.returncode == 0, first.stdout[-5000:]
    checkpoint_bytes = sum(os.path.getsize(p) for p in data_files(model_dir, 100))
    # Room for the small files a run rewrites (metrics, summaries), not for another checkpoint.
    fill(small_disk, leave=checkpoint_bytes // 2)
    result = run(train_cmd(*train_args(model_dir), *extra), timeout=TIMEOUT_S)
    assert_one_error_line(result, EXIT_STORAGE, f"{model_dir}/ckpt-200", "No space left on device")
    names = os.listdir(model_dir)
    assert not [n for n in names if n.endswith("_temp") or n.startswith("ckpt-200")], names
    assert latest_step(model_dir) == 100
