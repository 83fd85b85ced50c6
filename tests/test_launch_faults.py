"""A job that runs for days, as tfdist-launch supervises it: a side-car never ends training, and a
restart never makes a task that was not restarted miss its start-up deadline.

Real launcher, real processes (MNIST digits, multi_worker_mirrored with an evaluator), a real
SIGKILL. The restart budget's arithmetic (window, crash loop, delays) is in
tests/unit/test_restart_budget.py.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from clusterlib import (
    FAST_MNIST,
    BackgroundJob,
    launch_cmd,
    no_process_left,
    strategy_gin,
    train_records,
    train_step_reached,
)

STEPS = 600


def job(
    tmp_path, launch_args: list[str], *bindings: str, steps: int = STEPS
) -> tuple[BackgroundJob, str]:
    model_dir = str(tmp_path / "model")
    train_args = [
        *FAST_MNIST,
        strategy_gin("multi_worker_mirrored"),
        f"--gin_bindings=train.train_steps={steps}",
        "--gin_bindings=train.checkpoint_every_n_steps=100",
        *[f"--gin_bindings={b}" for b in bindings],
        f"--model_dir={model_dir}",
    ]
    cmd = launch_cmd(["--num_workers=2", "--evaluator", *launch_args], train_args)
    return BackgroundJob(cmd, str(tmp_path / "launch.out")), model_dir


def kill_and_finish(run: BackgroundJob, role: str, before=lambda: None) -> str:
    """SIGKILLs `role` once `before()` returned, waits for the job to succeed; its console output."""
    try:
        before()
        os.kill(run.task_pid(role), signal.SIGKILL)
        code = run.wait(timeout=300)
    finally:
        run.stop()
    out = run.output()
    assert code == 0, out[-6000:]
    return out


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_an_evaluator_that_dies_for_good_does_not_end_training(tmp_path):
    """The default policy (Never): the evaluator is given up with one line; the job succeeds."""
    run, model_dir = job(tmp_path, [])
    out = kill_and_finish(
        run,
        "evaluator:0",
        lambda: run.wait_until("step 100", train_step_reached(model_dir, 100), timeout=240),
    )
    assert re.search(
        r"^\[launch\] evaluation stopped: evaluator:0 exited with code 137 and is not restarted "
        r"\(the Never policy does not retry it\); training goes on without it",
        out,
        re.M,
    ), out[-4000:]
    assert "[launch] job succeeded (evaluation incomplete: evaluator:0 stopped early)" in out
    assert train_records(model_dir)[-1]["step"] == STEPS
    assert no_process_left(model_dir) == []


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_a_restart_long_after_the_evaluator_started_keeps_the_job_going(tmp_path):
    """A worker restarted more than --startup_timeout_s after the evaluator started: only the
    restarted tasks owe a start-up (the evaluator listens only while it waits for its peers).

    The job is long (it must still run past the evaluator's deadline on a slow host); once the
    restarted worker trains with the others again it is stopped with SIGTERM, as a user would."""
    startup_s, steps = 40, 100_000  # 40 s: five TF processes start on 2 loaded cores
    launched = time.monotonic()  # the evaluator starts after this
    run, model_dir = job(
        tmp_path, [f"--startup_timeout_s={startup_s}", "--restart_policy=OnFailure"], steps=steps
    )
    try:
        run.wait_until("step 100", train_step_reached(model_dir, 100), timeout=240)
        time.sleep(max(0.0, launched + startup_s + 2 - time.monotonic()))
        os.kill(run.task_pid("worker:1"), signal.SIGKILL)
        run.wait_until(
            "worker:1 restarted",
            lambda: re.search(
                r"^\[launch\] worker:1 exited with code 137.*; restarting", run.output(), re.M
            ),
            timeout=60,
        )
        # Synchronous workers: a step after the restart means worker:1 is back in the ring.
        after = train_records(model_dir)[-1]["step"]
        run.wait_until("training goes on", train_step_reached(model_dir, after + 300), timeout=240)
        out = run.output()
        assert "did not come up within" not in out, out[-4000:]
        after_restart = out.split("; restarting", 1)[1]
        assert not re.search(r"^\[launch\] .*(failed|exited with code)", after_restart, re.M), out[
            -4000:
        ]
    finally:
        run.stop()
    assert no_process_left(model_dir) == []


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_every_task_ends_when_the_launcher_is_killed(tmp_path):
    """SIGKILL to tfdist-launch alone (the OOM killer, a closed terminal): its tasks, each in its
    own session, stop within the grace period instead of serving and training on forever."""
    run, model_dir = job(tmp_path, ["--grace_s=5"], steps=100_000)
    try:
        run.wait_until("step 100", train_step_reached(model_dir, 100), timeout=240)
        tasks = [run.task_pid(role) for role in ("worker:0", "worker:1", "evaluator:0")]
        os.kill(run.proc.pid, signal.SIGKILL)  # the launcher only, not its tasks' sessions
        run.proc.wait()
        deadline = time.monotonic() + 60
        while no_process_left(model_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = no_process_left(model_dir)
    finally:
        run.stop()
    assert left == [], f"tasks {tasks} outlived their launcher:\n" + "\n".join(left)
