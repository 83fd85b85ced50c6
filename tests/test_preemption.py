"""Preemption: `kill -TERM` to one task of a real parameter_server job costs at most the current loop.

One job per restart policy (the default, Never, and `--restart_policy=OnFailure`):
`tfdist-launch` starts a chief, 2 workers, 1 ps and an evaluator, and the test
sends SIGTERM to one task at a time, by the pid the launcher prints, in the
middle of training; it checks what the user sees and where the job ends.
(Three preemptions share a job because starting a job is most of the cost
on a small machine.)

1. **worker:1**: it leaves (exit 143) in one line; the job goes on without
   it (Never) or with it restarted (OnFailure), as for a lost worker.
2. **evaluator:0**: it stops with exit code 0 in one line and is not
   restarted; training does not notice.
3. **ps:0**: the ps serves on and asks the chief to save; the chief saves at
   the end of its current loop, at or after the last step recorded before
   the signal (no work lost beyond that loop), and exits 143, and so does
   the ps. Never: the job ends with 143, and the same command again resumes
   from that checkpoint. OnFailure: the launcher restarts chief and ps,
   which resume from it. Either way training ends at exactly
   train.train_steps.
"""

from __future__ import annotations

import os
import re
import signal

import clusterlib
import pytest
from clusterlib import BackgroundJob, train_step_reached
from faultlib import POLICY_FLAGS, FaultRun, fault_run
from test_durability import (
    TIMEOUT_S,
    assert_finished_at,
    latest_step,
    mnist_args,
    read_log,
    restored_steps,
)

# Long enough that the ps is preempted mid-training after the evaluator has exited: the ps's
# SIGTERM comes at step max(450, the step at the evaluator's exit + 60), and the evaluator polls
# every second for the first checkpoint (step 200): steps 460 (Never) and 660 (OnFailure) on a
# 2-core host; 2000 leaves three times that (4000 only trained longer after the resume). The test
# fails, never passes, if the ps's signal comes after the end.
STEPS = 2000
CHECKPOINT_EVERY = 200
LOG_EVERY = 20


def launch(tmp_path, name: str, policy: str, **fault) -> FaultRun:
    """The job (chief, 2 workers, 1 ps, an evaluator) under `policy`, run to its end; `fault` is
    fault_run's: the signals dealt on the way."""
    args = mnist_args(
        "parameter_server",
        str(tmp_path / "model"),
        STEPS,
        log_every=LOG_EVERY,
        checkpoint_every=CHECKPOINT_EVERY,
    )
    return fault_run(
        args,
        tmp_path / f"{name}.out",
        launch_args=["--num_workers=2", "--num_ps=1", "--evaluator"],
        policy=policy,
        timeout=TIMEOUT_S,
        **fault,
    )


def sigterm(job: BackgroundJob, role: str) -> None:
    os.kill(job.task_pid(role), signal.SIGTERM)


def one_line(pattern: str, text: str) -> re.Match:
    found = re.findall(pattern, text, re.M)
    assert len(found) == 1, f"want one line matching {pattern!r}, got {len(found)}:\n{text[-6000:]}"
    return re.search(pattern, text, re.M)


def launcher_restarts(out: str) -> list[str]:
    return re.findall(r"^\[launch\] .* restarting .*$", out, re.M)


@pytest.mark.cluster
@pytest.mark.parametrize("policy", POLICY_FLAGS)
def test_sigterm_to_a_worker_the_evaluator_then_the_ps(tmp_path, policy):
    model_dir = str(tmp_path / "model")
    eval_path = os.path.join(model_dir, "eval", "metrics.jsonl")

    def worker_then_evaluator(job: BackgroundJob) -> int | None:
        """The two SIGTERMs before the ps's; returns the last periodic checkpoint before it."""
        job.wait_until("a train record at step >= 100", train_step_reached(model_dir, 100))
        sigterm(job, "worker:1")
        job.wait_until("the evaluator's first evaluation", lambda: clusterlib.read_jsonl(eval_path))
        sigterm(job, "evaluator:0")
        job.wait_until(
            "the launcher saw the evaluator exit",
            lambda: "evaluator:0 exited with code 143" in job.output(),
        )
        # Past a periodic checkpoint: a save at the signal is then visibly newer than it.
        at_evaluator = clusterlib.train_records(model_dir)[-1]["step"]
        ps_step = max(450, at_evaluator + 60)
        job.wait_until(
            f"a train record at step >= {ps_step}",
            train_step_reached(model_dir, ps_step),
            poll_s=0.01,
        )
        return latest_step(model_dir)

    run = launch(
        tmp_path, "run1", policy, before=worker_then_evaluator, kill="ps:0", signal=signal.SIGTERM
    )
    out, code, periodic = run.out, run.code, run.before
    at_signal = run.step_at_fault
    assert at_signal < STEPS, "the ps got SIGTERM after training ended; nothing was exercised"

    # 1. The worker leaves in one line, and the launcher says what the job does without it.
    one_line(
        r"^\[worker:1\] error: stopped by SIGTERM: the job goes on without this worker \(the chief "
        r"runs its unfinished step loops on the others\); exiting with code 143",
        out,
    )
    if policy == "Never":
        one_line(
            r"^\[launch\] worker:1 exited with code 143 \(preempted\) and is not restarted \(the "
            r"Never policy does not retry it\); the job goes on with 1 of 2 workers",
            out,
        )
    else:
        one_line(
            r"^\[launch\] worker:1 exited with code 143 \(preempted\); restarting worker:1 in", out
        )

    # 2. The evaluator ends after its evaluation in one line, exit 143 (preempted): a restart
    # policy brings it back; without one it is given up and training goes on.
    one_line(
        r"^\[evaluator:0\] error: stopped by SIGTERM after evaluating step \d+; training goes on "
        r"without the evaluator: exiting with code 143",
        out,
    )
    if policy == "Never":
        one_line(
            r"^\[launch\] evaluation stopped: evaluator:0 exited with code 143 \(preempted\) and "
            r"is not restarted \(the Never policy does not retry it\); training goes on without it",
            out,
        )
    else:
        one_line(r"^\[launch\] evaluator:0 exited with code 143 \(preempted\); restarting", out)

    # 3. The ps holds its exit; the chief saves at its next loop boundary and exits; the ps follows.
    one_line(r"^\[ps:0\] .*SIGTERM received: serving on until the chief has saved", out)
    chief = one_line(
        r"^\[chief:0\] error: ps:0 was preempted \(SIGTERM\): stopped at step (\d+) after saving a "
        r"checkpoint of its variables; exiting with code 143 \(retryable\)",
        out,
    )
    saved = int(chief.group(1))
    ps = one_line(
        r"^\[ps:0\] error: stopped by SIGTERM after the chief saved this task's variables in a "
        r"checkpoint at step (\d+); exiting with code 143",
        out,
    )
    assert int(ps.group(1)) == saved, (ps.group(0), saved)
    # No work lost beyond the loop that was running: the save is at or after the last step
    # recorded before the signal, and newer than the last periodic checkpoint.
    assert saved >= at_signal and (saved > periodic or at_signal == periodic), (
        saved,
        at_signal,
        periodic,
    )

    if policy == "Never":
        assert code == 143, f"tfdist-launch exited {code}, want 143:\n{out[-8000:]}"
        run.assert_said(
            r"^\[launch\] (chief|ps):0 exited with code 143 \(preempted\); stopping the cluster "
            r"because the Never policy does not retry it",
            re.M,
        )
        assert launcher_restarts(out) == [], out[-6000:]
        assert latest_step(model_dir) == saved
        # The user runs the same command again: it resumes from that checkpoint.
        run = launch(tmp_path, "run2", "Never")
    else:
        one_line(
            r"^\[launch\] (chief|ps):0 exited with code 143 \(preempted\); restarting chief:0, "
            r"ps:0 in",
            out,
        )
        assert len(launcher_restarts(out)) == 3, launcher_restarts(out)  # worker, evaluator, ps
    out = run.assert_launch_ok()
    # Only the ps's preemption restarted the chief, from the checkpoint it saved then.
    assert restored_steps(read_log(model_dir, "chief:0")) == [saved]
    assert_finished_at(model_dir, STEPS, out)
    print(
        f"\n[preemption] {policy}: SIGTERM to ps:0 after step {at_signal} (periodic checkpoint "
        f"{periodic}); the chief saved step {saved}; the job resumed from it and ended at {STEPS}"
    )
