"""Chaos, short: five spaced faults of three kinds against one parameter_server job, under
`--restart_policy=OnFailure` with the DEFAULT restart budget (5 restarts within 300 s).

benchmarks/chaos.py runs the long version (20 faults per job, 60 s apart, and multi_worker_mirrored
too). Here each fault still waits for the previous recovery (the launcher restarted what it
restarts, a restarted ps or worker listens again, and a train record past the fault's step was
written since), then 5 s. The five faults fall within one 300 s window and each costs exactly one
restart, so they spend the whole default budget and no more: the job survives them by design, and
a sixth restart (a fault the launcher had to handle twice) would fail it or leave a worker given
up, which the test catches. Nothing is loosened: no --backoff_limit or --backoff_window_s.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import chaos

TRAIN_STEPS = 7000  # the faults fall in the first 40-50% (steps 2,860-4,100 at the fifth)
SCHEDULE = [  # three kinds: SIGKILL a worker, SIGKILL the ps (chief and ps restart), SIGTERM a worker
    ("SIGKILL", "worker:0"),
    ("SIGKILL", "ps:0"),
    ("SIGTERM", "worker:1"),
    ("SIGKILL", "worker:1"),
    ("SIGKILL", "ps:0"),
]


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_five_spaced_faults_within_the_default_budget(tmp_path):
    schedule = [{"signal": s, "role": r, "wait_s": 5.0} for s, r in SCHEDULE]
    result = chaos.run_job("ps", schedule, TRAIN_STEPS, str(tmp_path / "ps"), recovery_s=120)
    print(json.dumps(chaos.counts(result)), *map(json.dumps, result["faults"]), sep="\n")
    # The launcher says which task exited with what; each task's own last words say why.
    launcher = "\n".join(result["launcher_lines"] + ["[tasks' last words]"] + result["last_words"])
    assert result["exit_code"] == 0, launcher
    assert result["final_step"] == TRAIN_STEPS, launcher
    assert result["faults_dealt"] == len(SCHEDULE), (result["faults"], launcher)
    assert all(f["recovered"] for f in result["faults"]), launcher
    assert result["faults_survived"] == len(SCHEDULE)
    # One restart per fault, none given up: the default budget was enough, and only just.
    assert result["restarts"] == len(SCHEDULE) and not result["given_up"], launcher
    restarted = [f["restarted"] for f in result["faults"]]
    assert restarted == [
        ["worker:0"],
        ["chief:0", "ps:0"],
        ["worker:1"],
        ["worker:1"],
        ["chief:0", "ps:0"],
    ]
    # A worker's loss costs no step; the ps's the steps since the last checkpoint (one every 100
    # steps). The step at the fault is the last train record's, which may trail that checkpoint.
    for f in result["faults"]:
        assert abs(f["steps_lost"]) < 200 if f["role"] == "ps:0" else f["steps_lost"] == 0, f
