"""Elastic multi_worker_mirrored: a worker lost for good shrinks the job instead of stopping it.

A real 3-worker job from tfdist-launch under the default restart policy
(Never): one worker is SIGKILLed mid-run; with --min_workers=2 the launcher
restarts the two others from the last checkpoint as a 2-worker cluster with
the same global batch, and the job ends at exactly train_steps.
"""

from __future__ import annotations

import json
import os
import re

import clusterlib
import pytest
from clusterlib import FAST_MNIST, launch_cmd, strategy_gin
from faultlib import fault_run

STEPS = 1000  # the kill at step 300, then 800 steps resumed from ckpt-200 (every 50 a record)
TIMEOUT_S = 400


def _train_args(model_dir: str) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin("multi_worker_mirrored"),
        # The global batch stays when the job shrinks: divisible by 3 and by 2 replicas.
        "--gin_bindings=Trainer.global_batch_size=96",
        f"--gin_bindings=train.train_steps={STEPS}",
        "--gin_bindings=train.log_every_n_steps=50",
        "--gin_bindings=train.checkpoint_every_n_steps=200",
        f"--model_dir={model_dir}",
    ]


@pytest.mark.cluster
def test_a_worker_lost_for_good_shrinks_the_job_which_ends_at_train_steps(tmp_path):
    model_dir = str(tmp_path / "model")
    run = fault_run(
        _train_args(model_dir),
        tmp_path / "launch.out",
        launch_args=["--num_workers=3", "--min_workers=2"],
        kill="worker:2",
        at_step=300,  # past ckpt-200: every worker saves it before it takes step 201
        timeout=TIMEOUT_S,
    )
    out = run.assert_launch_ok()
    run.assert_said(
        r"\[launch\] worker:2 exited with code 137 and is not restarted \(the Never policy does not "
        r"retry it\); membership 3 -> 2 workers \(--min_workers=2\): restarting worker:0, worker:1 "
        r"from the last checkpoint with the same global batch"
    )
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    (change,) = [r for r in records if r["kind"] == "membership"]
    assert change["workers"] == 2 and change["lost"] == "worker:2" and change["step"] >= 200
    # The restarted workers resume from the checkpoint the record names; no step is counted twice:
    # the records after the change go on from there, strictly increasing, to exactly train_steps.
    restored = [int(s) for s in re.findall(r"\[worker:0\] .*restored \S+ \(step (\d+)\)", out)]
    assert restored == [change["step"]], restored
    after = [r["step"] for r in records if r["kind"] == "train" and r["time"] > change["time"]]
    assert after and after == sorted(set(after)) and after[0] > change["step"], after
    assert after[-1] == STEPS, after
    done = re.findall(
        r"\[(worker:\d)\] .*training done at step (\d+) .*weights fingerprint (\w+)", out
    )
    finals = {role: (int(step), fp) for role, step, fp in done}
    assert set(finals) == {"worker:0", "worker:1"}, done
    assert {step for step, _ in finals.values()} == {STEPS}
    assert len({fp for _, fp in finals.values()}) == 1, f"the survivors' weights differ: {finals}"


@pytest.mark.cluster
def test_min_workers_outside_the_cluster_or_strategy_is_one_sentence(tmp_path):
    model_dir = str(tmp_path / "model")
    r = clusterlib.run(
        launch_cmd(["--num_workers=2", "--min_workers=3"], _train_args(model_dir)), timeout=120
    )
    assert r.returncode == 2, r.stdout[-3000:]
    assert "[launch] error: --min_workers must be between 1 and --num_workers=2, got 3." in r.stdout
    ps_args = [a for a in _train_args(model_dir) if "multi_worker_mirrored" not in a]
    r = clusterlib.run(
        launch_cmd(
            ["--num_workers=2", "--num_ps=1", "--min_workers=1"],
            [*ps_args, strategy_gin("parameter_server")],
        ),
        timeout=120,
    )
    assert r.returncode == 2, r.stdout[-3000:]
    assert (
        "[launch] error: --min_workers applies to multi_worker_mirrored only (the strategy is "
        "parameter_server); drop it." in r.stdout
    )


@pytest.mark.cluster
def test_a_worker_s_own_error_fails_the_job_instead_of_shrinking_it(tmp_path):
    """Exit 1-127 is a bug or a bad setting, which a smaller cluster would meet the same way."""
    model_dir = str(tmp_path / "model")
    args = [a for a in _train_args(model_dir) if "global_batch_size" not in a]  # 64: not by 3
    r = clusterlib.run(launch_cmd(["--num_workers=3", "--min_workers=2"], args), timeout=TIMEOUT_S)
    assert r.returncode == 2, r.stdout[-4000:]
    assert "Trainer.global_batch_size=64 is not divisible by the 3 replicas in sync" in r.stdout
    assert "membership" not in r.stdout, r.stdout[-4000:]
