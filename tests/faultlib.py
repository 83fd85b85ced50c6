"""One fault run: a real job started, a real signal dealt to one of its processes, the job waited for.

The durability, preemption, elastic, field-ready and data-service tests each start a job, wait
for a train step, signal a task, wait for the end and read what it left. `fault_run` does that
one sequence for all of them, so each test states only its fault (who, at which step, which
signal, under which restart policy) and what it checks afterwards; the timing of every step of the
sequence (the poll interval, when the clock is read, when the session is torn down) is then the
same in every test.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from signal import SIGKILL
from typing import Any

from clusterlib import BackgroundJob, launch_cmd, train_cmd, train_records, train_step_reached

#: `kill=PROCESS`: the signal goes to the command's own process (tfdist-train run without the
#: launcher), not to a task the launcher started.
PROCESS = "process"

#: The launcher's flags for each restart policy. Never is its default, so it adds no flag;
#: OnFailure retries quickly (1 s apart) so that a restart fits in a test's time.
POLICY_FLAGS: dict[str, list[str]] = {
    "Never": [],
    "OnFailure": ["--restart_policy=OnFailure", "--backoff_limit=3", "--restart_backoff_s=1"],
}


def step_before(records: list[dict], kill_time: float) -> int:
    """The last step recorded before the kill."""
    before = [r["step"] for r in records if r["time"] <= kill_time]
    assert before, f"no train record before the kill: {records}"
    return max(before)


@dataclass
class FaultRun:
    """What a fault run left: its output and exit code, and the train records of its model_dir."""

    out: str
    code: int
    records: list[dict]
    #: time.time() just before the job started, when the fault was dealt (None: no fault), and
    #: when the job had ended.
    start_time: float
    fault_time: float | None
    end_time: float
    #: What the `before` and `after` callbacks returned.
    before: Any = None
    after: Any = None

    @property
    def step_at_fault(self) -> int:
        """The last step recorded before the fault (computed on demand: it asserts there is one)."""
        assert self.fault_time is not None, "no fault was dealt in this run"
        return step_before(self.records, self.fault_time)

    def assert_launch_ok(self) -> str:
        """The launcher exited 0; returns its output."""
        assert self.code == 0, f"tfdist-launch exited {self.code}:\n{self.out[-8000:]}"
        return self.out

    def assert_said(self, pattern: str, flags: int = 0) -> re.Match:
        """The output matches `pattern` somewhere (re.search); a failure shows the output's tail."""
        found = re.search(pattern, self.out, flags)
        assert found, self.out[-6000:]
        return found


def model_dir_of(train_args: Sequence[str]) -> str:
    """The --model_dir of a command line: where its records are, so callers do not name it twice."""
    found = [a.split("=", 1)[1] for a in train_args if a.startswith("--model_dir=")]
    assert len(found) == 1, f"want one --model_dir= in the train args: {train_args}"
    return found[0]


def fault_run(
    train_args: Sequence[str],
    out_path: str | os.PathLike,
    *,
    launch_args: Sequence[str] | None = None,
    policy: str = "Never",
    kill: str | None = None,
    at_step: int | None = None,
    signal: int = SIGKILL,
    poll_s: float = 0.02,
    before: Callable[[BackgroundJob], Any] | None = None,
    after: Callable[[BackgroundJob], Any] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = BackgroundJob.timeout_s,
) -> FaultRun:
    """Runs one job to its end, dealing `signal` to `kill` once a train record at `at_step` exists.

    The job is `tfdist-launch <launch_args> <policy's flags> -- <train_args>`, or `tfdist-train
    <train_args>` alone when `launch_args` is None; its output goes to `out_path`. `kill` is a
    task's role ("worker:1", found by the pid the launcher printed), PROCESS (the command's own
    process), or None for a run without a fault (a rerun). `at_step=None` deals the fault as soon
    as `before` returns. `before(job)` runs once the job started: earlier faults and waits of a run
    that deals several, or a fault timed by something other than a step (the test then deals it
    itself). `after(job)` runs right after the signal, before waiting for the end: what must be
    seen at the fault (the latest checkpoint), or a second fault. `timeout` bounds each wait. The
    whole session is SIGKILLed at the end, so no task outlives the run even when a wait fails.
    """
    model_dir = model_dir_of(train_args)
    if launch_args is None:
        assert policy == "Never", "a restart policy needs the launcher (launch_args)"
        cmd = train_cmd(*train_args)
    else:
        cmd = launch_cmd([*launch_args, *POLICY_FLAGS[policy]], train_args)
    start_time = time.time()
    job = BackgroundJob(cmd, str(out_path), env=env)
    job.timeout_s = timeout
    fault_time = before_value = after_value = None
    try:
        if before is not None:
            before_value = before(job)
        if kill is not None:
            if at_step is not None:
                job.wait_until(
                    f"a train record at step >= {at_step}",
                    train_step_reached(model_dir, at_step),
                    poll_s=poll_s,
                )
            if kill == PROCESS:
                job.proc.send_signal(signal)
            else:
                os.kill(job.task_pid(kill), signal)
            fault_time = time.time()
        if after is not None:
            after_value = after(job)
        code = job.wait()
        end_time = time.time()
    finally:
        job.kill_group()
    return FaultRun(
        out=job.output(),
        code=code,
        records=train_records(model_dir),
        start_time=start_time,
        fault_time=fault_time,
        end_time=end_time,
        before=before_value,
        after=after_value,
    )
