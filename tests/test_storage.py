"""model_dir on shared storage: every read and write goes through tf.io.gfile.

A ``ram://`` model_dir (TensorFlow's in-memory file system, private to one
process) and a ``file://`` URI (which Python's `open`, `os` and `shutil` take
for a relative path) make any stray local-disk access fail or show up as a
folder named ``ram:`` or ``file:`` in the working directory, which is why the
processes run with ``cwd=tmp_path``. The ``ram://`` runs drive the CLI inside
one Python process that then lists what the run wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import clusterlib
import pytest
import tensorflow as tf
from clusterlib import FAST_MNIST, PYTHON, base_env, launch_cmd, strategy_gin

from tfdist_trainer.io import markers
from tfdist_trainer.launch import supervisor

STEPS = 40
TIMEOUT_S = 180


def _args(strategy: str, model_dir: str) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin(strategy),
        f"--gin_bindings=train.train_steps={STEPS}",
        "--gin_bindings=train.log_every_n_steps=20",
        "--gin_bindings=train.checkpoint_every_n_steps=20",
        f"--model_dir={model_dir}",
    ]


def _run(cmd: list[str], cwd) -> subprocess.CompletedProcess:
    return clusterlib.run(cmd, env=base_env(), cwd=str(cwd), timeout=TIMEOUT_S)


def _assert_no_stray_dirs(cwd) -> None:
    """Python's open()/os on a URI would have made a relative folder named after its scheme."""
    stray = [name for name in os.listdir(cwd) if name.rstrip(":") in ("ram", "file", "gs", "s3")]
    assert not stray, f"a URI model_dir was used as a local path: {stray} in {cwd}"


def _assert_run_complete(files: dict[str, str], output: str) -> None:
    """`files`: path relative to model_dir -> text (only for the small text files), as the run left them."""
    assert "checkpoint" in files and any(name.startswith(f"ckpt-{STEPS}.") for name in files), (
        f"no checkpoint at step {STEPS}: {sorted(files)}\n{output[-4000:]}"
    )
    records = [json.loads(line) for line in files["metrics.jsonl"].splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [20, 40], records
    assert any(r["kind"] == "eval" and r["step"] == STEPS for r in records), records
    assert (
        files["config.gin"].startswith("# command:") and "train.train_steps" in files["config.gin"]
    )
    assert "train.train_steps" in files["operative_config.gin"]
    marker = json.loads(files[markers.DONE_FILE])
    assert marker["step"] == STEPS and marker["run_id"], marker
    assert not any(".tmp-" in name for name in files), f"a temporary file was left: {sorted(files)}"


# One Python process: runs tfdist-train's main, then lists what it wrote under the ram:// model_dir.
# tfdist-train leaves a finished task without interpreter teardown (launch/quick_exit.py) but runs
# the exit functions first: the listing is one, so it also shows that a user's atexit hook runs.
_IN_PROCESS = r"""
import atexit, json, sys
import tensorflow as tf
from tfdist_trainer import cli
model_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--model_dir="))
sys.argv = ["tfdist-train", *sys.argv[1:]]

def list_ram_files():
    files = {}
    for root, _, names in tf.io.gfile.walk(model_dir):
        for name in names:
            path = root.rstrip("/") + "/" + name
            rel = path[len(model_dir):].lstrip("/")
            small = name in ("metrics.jsonl", "config.gin", "operative_config.gin", "training_done", "checkpoint")
            files[rel] = tf.io.gfile.GFile(path).read() if small else ""
    print("RAM_FILES " + json.dumps(files), flush=True)

atexit.register(list_ram_files)
cli.run()
"""


@pytest.mark.cluster
# one_device: one process writes everything. Replicated variables through gfile (a mirrored run
# once had its own [mirrored] case here) are test_file_uri_model_dir_via_launcher's
# multi_worker_mirrored case, where a stray local path shows up as a folder named 'file:'.
@pytest.mark.parametrize("strategy", ["one_device"])
def test_ram_model_dir_in_one_process(tmp_path, strategy):
    model_dir = f"ram://tfdist-{uuid.uuid4().hex[:8]}/run"
    result = _run([PYTHON, "-c", _IN_PROCESS, *_args(strategy, model_dir)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    listing = [line for line in result.stdout.splitlines() if line.startswith("RAM_FILES ")]
    assert listing, result.stdout[-4000:]
    files = json.loads(listing[-1][len("RAM_FILES ") :])
    _assert_run_complete(files, result.stdout)
    replicas = {"one_device": 1, "mirrored": 2}[strategy]
    assert f"strategy {strategy} with {replicas} replica(s) in sync" in result.stdout
    _assert_no_stray_dirs(tmp_path)


def _local_files(model_dir: str) -> dict[str, str]:
    files = {}
    for root, _, names in os.walk(model_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, errors="replace") as f:
                files[os.path.relpath(path, model_dir)] = f.read()
    return files


@pytest.mark.cluster
@pytest.mark.parametrize(
    "strategy, launch_args, roles",
    [
        (
            "parameter_server",
            ["--num_workers=2", "--num_ps=1"],
            ["chief:0", "worker:0", "worker:1", "ps:0"],
        ),
        ("multi_worker_mirrored", ["--num_workers=2"], ["worker:0", "worker:1"]),
    ],
)
def test_file_uri_model_dir_via_launcher(tmp_path, strategy, launch_args, roles):
    local = tmp_path / "run"
    model_dir = f"file://{local}"
    train_args = _args(strategy, model_dir)
    if strategy == "parameter_server":
        # Far longer than the test: a serving task that exits must have seen the done marker.
        train_args.append("--chief_gone_grace_s=600")
    result = _run(launch_cmd(launch_args, train_args), cwd=tmp_path)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    files = _local_files(str(local))
    _assert_run_complete(files, out)
    assert tf.train.latest_checkpoint(str(local)).endswith(f"ckpt-{STEPS}")
    assert clusterlib.throw_away_checkpoints(local) == []
    assert sorted(os.listdir(local / "logs")) == sorted(r.replace(":", "-") + ".log" for r in roles)
    for role in roles:
        assert files[f"logs/{role.replace(':', '-')}.log"].strip(), f"{role}'s log copy is empty"
    servers = [
        r for r in roles if r.startswith(("ps", "worker")) and strategy == "parameter_server"
    ]
    # they saw the marker and exited 0 by themselves, before the launcher stopped them
    for role in servers:
        assert role in supervisor.finished_tasks(out), out[-6000:]
        assert (
            "the chief marked training done: exiting" in files[f"logs/{role.replace(':', '-')}.log"]
        )
    _assert_no_stray_dirs(tmp_path)
    assert clusterlib.no_process_left(str(local)) == []


def test_launcher_refuses_a_ram_model_dir(tmp_path):
    result = _run(
        launch_cmd(["--num_workers=2"], _args("multi_worker_mirrored", "ram://x/run")), cwd=tmp_path
    )
    assert result.returncode == 2, result.stdout[-3000:]
    assert "in-memory and private to one process" in result.stdout
