"""SIGTERM is honoured within one loop, whatever `train.log_every_n_steps` is (issue 40, item 1).

A preempted task has the grace period (Kubernetes: 30 s by default) to save.
These runs log far less often than they train (`log_every_n_steps` beyond
`train_steps`), save no periodic checkpoint, and get SIGTERM in the middle of
training: a checkpoint must exist within 30 s of the signal, then the task
exits 143. Before, a loop ran until the next hook stop (here: the last step),
so the first checkpoint came when training ended, minutes later (checked:
each test fails on the code before the change, with no checkpoint 30 s after
the signal).

The one progress line such a run writes is the profiler's
(`train.profile_steps=(1, N)`): it ends a loop at step N and logs
"profiling stopped at step N"; the signal comes a second later, so after N
steps were trained. After N no hook stops a loop before `train_steps`.

1. one_device through `tfdist-train`.
2. parameter_server (chief, 1 worker, 1 ps) through `tfdist-launch`: SIGTERM
   to the chief, which stops scheduling, saves after its in-flight closures,
   and exits 143; the launcher (Never) ends the job with 143.
3. multi_worker_mirrored (2 workers) through `tfdist-launch`: SIGTERM to
   worker:1 only. The workers agree between calls, so both stop after the
   same call, save together (the chief's copy is kept) and exit 143.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from clusterlib import BackgroundJob, mnist_args
from faultlib import PROCESS, FaultRun, fault_run
from test_durability import latest_step

STEPS = 100_000  # minutes of training on any machine: a save at the end comes far too late
LOG_EVERY = 1_000_000  # far beyond the run: no progress line, no hook stop before the end
PROFILED = 20  # the profiler's loop ends here: the run's one progress line
GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds
START_TIMEOUT_S = 240


def bindings(steps_per_loop: int | None = None) -> list[str]:
    extra = [
        f"--gin_bindings=train.log_every_n_steps={LOG_EVERY}",
        "--gin_bindings=train.checkpoint_every_n_steps=None",
        f"--gin_bindings=train.profile_steps=(1, {PROFILED})",
    ]
    if steps_per_loop is not None:
        extra.append(f"--gin_bindings=train.steps_per_loop={steps_per_loop}")
    return extra


def training(job: BackgroundJob) -> None:
    """Waits until the run has trained past the profiled steps (so the signal comes mid-training)."""
    job.timeout_s = START_TIMEOUT_S
    job.wait_until(
        f"training past step {PROFILED}",
        lambda: f"profiling stopped at step {PROFILED}" in job.output(),
        poll_s=0.05,
    )
    time.sleep(1.0)  # into the next loop, past the hooks that ran at the profiled step


def checkpoint_within_grace(model_dir: str):
    """Returns a callback for fault_run's `after`: (seconds from the signal to a checkpoint, its step)."""

    def after(job: BackgroundJob) -> tuple[float, int]:
        signalled = time.monotonic()
        while time.monotonic() - signalled < GRACE_S:
            step = latest_step(model_dir)
            if step is not None:
                return time.monotonic() - signalled, step
            time.sleep(0.05)
        raise AssertionError(
            f"no checkpoint in {model_dir} {GRACE_S}s after SIGTERM (log_every_n_steps={LOG_EVERY}):"
            f"\n{job.output()[-6000:]}"
        )

    return after


def stopped_step(out: str, role: str) -> int:
    """The step `role` said it stopped at; a task whose sentence was another's word for word is
    named once by the launcher ('<role> ended with the same error as <other>'): the other's."""
    found = re.findall(
        rf"^\[{re.escape(role)}\] error: stopped by SIGTERM at step (\d+) after saving a "
        r"checkpoint; run the same command again to resume\.",
        out,
        re.M,
    )
    same = re.findall(
        rf"^\[launch\] {re.escape(role)} ended with the same error as (\S+)$", out, re.M
    )
    if not found and same:
        return stopped_step(out, same[0])
    assert len(found) == 1, out[-6000:]
    return int(found[0])


def sigterm_mid_training(
    tmp_path, strategy: str, *, kill: str, saver: str, launch_args=None, steps_per_loop=None
) -> FaultRun:
    """Runs `strategy`, SIGTERMs `kill` mid-training; checks that a checkpoint came within the
    grace, that the job exited 143, and that `saver` said it stopped at that checkpoint's step."""
    model_dir = str(tmp_path / "model")
    run = fault_run(
        mnist_args(strategy, model_dir, STEPS, *bindings(steps_per_loop)),
        tmp_path / "run.out",
        launch_args=launch_args,
        kill=kill,
        signal=signal.SIGTERM,
        before=training,
        after=checkpoint_within_grace(model_dir),
        timeout=START_TIMEOUT_S,
    )
    seconds, step = run.after
    assert run.code == 143, f"the job exited {run.code}, want 143:\n{run.out[-6000:]}"
    stopped = stopped_step(run.out, saver)
    assert PROFILED <= stopped < STEPS and latest_step(model_dir) == stopped == step, (
        stopped,
        step,
    )
    print(
        f"\n[sigterm] {strategy}: checkpoint at step {step} {seconds:.1f}s after SIGTERM to {kill}"
    )
    return run


@pytest.mark.cluster
def test_one_device_saves_within_one_loop_of_sigterm(tmp_path):
    sigterm_mid_training(tmp_path, "one_device", kill=PROCESS, saver="local", steps_per_loop=20)


@pytest.mark.cluster
def test_parameter_server_chief_saves_within_one_batch_of_sigterm(tmp_path):
    run = sigterm_mid_training(
        tmp_path,
        "parameter_server",
        kill="chief:0",
        saver="chief:0",
        launch_args=["--num_workers=1", "--num_ps=1"],
    )
    run.assert_said(
        r"^\[launch\] chief:0 exited with code 143 \(preempted\); stopping the cluster because "
        r"the Never policy does not retry it",
        re.M,
    )


@pytest.mark.cluster
def test_multi_worker_mirrored_workers_agree_to_save_within_one_loop(tmp_path):
    # Only worker:1 gets the signal; worker:0 (the chief) stops after the same call and saves.
    run = sigterm_mid_training(
        tmp_path,
        "multi_worker_mirrored",
        kill="worker:1",
        saver="worker:0",
        launch_args=["--num_workers=2"],
        steps_per_loop=20,
    )
    assert stopped_step(run.out, "worker:1") == stopped_step(run.out, "worker:0"), run.out[-6000:]
