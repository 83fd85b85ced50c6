"""Chaos: many spaced faults against whole tfdist-launch jobs, under OnFailure and the DEFAULT budget.

Why: the tests deal one or two faults each, but the restart budget is a promise about many: it
counts restarts within a window (--backoff_limit=5 per --backoff_window_s=300 by default), so a
long job that loses a task now and then must never run out. This deals --faults faults to one
parameter_server job (chief, 2 workers, 1 ps, evaluator) and one multi_worker_mirrored job
(3 workers, evaluator) of the MNIST recipe (offline digits, a tiny CNN, a checkpoint every 100
steps), SIGKILL and SIGTERM to each task type, at random times from a seeded schedule (--seed).
A fault is dealt only after the previous one's recovery (the launcher started again what it
restarts, a restarted ps or worker listens again, and a train record past the fault's step was
written since) plus --spacing_s and up to half as much again (drawn). The spacing defaults to the
window over the limit, 60 s: as spaced as the budget assumes, so no window holds more restarts
than it allows. Per job: faults dealt and survived (the job exited 0), restarts (the launcher's
`restarting` lines), steps lost (the step at the fault minus the step the driver restored,
summed), the final step (train_steps exactly) and the wall time against a fault-free run of the
same job in the same invocation. Not in run_all (`make bench`): --faults=20 takes over an hour per
job (the parameter_server job's faulty run alone: 40 minutes on the 2-core VM).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

from benchmarks import _bench
from tfdist_trainer.launch.flags import FLAGS as LAUNCH
from tfdist_trainer.launch.process_group import signal_group
from tfdist_trainer.launch.supervisor import started_tasks

NAME = "chaos"
#: tfdist-launch's defaults, which the jobs keep: 5 restarts within any 300 s.
WINDOW_S, LIMIT = LAUNCH["backoff_window_s"].default, LAUNCH["backoff_limit"].default
JOBS = {  # launch flags, strategy, the task whose log says what it restored, global batch
    "ps": (["--num_workers=2", "--num_ps=1", "--evaluator"], "parameter_server", "chief:0", 64),
    "mwms": (["--num_workers=3", "--evaluator"], "multi_worker_mirrored", "worker:0", 48),
}
TYPES = {"ps": ("ps", "worker", "chief", "evaluator"), "mwms": ("worker", "evaluator")}
KINDS = {job: [(s, t) for t in TYPES[job] for s in ("SIGKILL", "SIGTERM")] for job in TYPES}
#: steps/s of each job on the 2-core VM while `make test` runs (measured 155 and 115): sizes
#: the default train_steps so that training outlasts the faults.
RATE = {"ps": 160.0, "mwms": 120.0}
RESTARTING = re.compile(r"^\[launch\] .*; restarting (.+?) in [\d.]+s", re.M)
GONE = r"^\[launch\] (evaluation stopped: |finished: (.*, )?{role}(,|$)|{role} exited .* is not restarted)"
GIVEN_UP = re.compile(r"^\[launch\] (.*(?:not restarted|evaluation stopped).*)$", re.M)
#: A task's last words in its log: the one sentence it ended with (`[worker:1] error: ...`).
TASK_ERROR = re.compile(r"^\[[a-z_]+:\d+\] error: .*$", re.M)


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, faults=20)
    p.add_argument("--jobs", default="ps,mwms", help="of ps, mwms")
    p.add_argument("--spacing_s", type=float, default=WINDOW_S / LIMIT, help="after a recovery")
    p.add_argument("--train_steps", type=int, help="default: enough for the faults at RATE")
    p.add_argument("--recovery_s", type=float, default=300.0, help="the most a recovery takes")
    args = _bench.parse(p, argv, "--faults=3 --spacing_s=5")
    args.jobs = [j for j in args.jobs.split(",") if j]
    if not args.jobs or set(args.jobs) - set(JOBS):
        p.error(f"--jobs: a subset of {','.join(JOBS)}, got {args.jobs}")
    return args


def plan(kinds, faults: int, seed: int, spacing_s: float, num_workers: int) -> list[dict]:
    """The seeded schedule: each kind about as often, shuffled; each fault's wait after recovery.
    Every kind is survivable: a SIGTERMed evaluator exits 143 and is restarted like a killed one."""
    rng = random.Random(seed)
    picks = [kinds[i % len(kinds)] for i in range(faults)]
    rng.shuffle(picks)
    return [
        {"signal": sig, "role": f"{t}:{rng.randrange(num_workers) if t == 'worker' else 0}",
         "wait_s": round(spacing_s * (1 + rng.random() / 2), 1)}
        for sig, t in picks
    ]  # fmt: skip


def train_records(model_dir: str) -> list[dict]:
    """metrics.jsonl's train records, read as a plain file (the library's reader imports TF)."""
    try:
        with open(os.path.join(model_dir, "metrics.jsonl")) as f:
            lines = [line for line in f if '"kind": "train"' in line]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.endswith("\n")]  # not one being written


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
        return True
    except OSError:
        return False


class Job:
    """One tfdist-launch job (OnFailure, the default budget) in its own session, output in a file."""

    def __init__(self, job: str, train_steps: int, run_dir: str):
        launch, strategy, self.driver, batch = JOBS[job]
        strategy = f"strategies/{strategy}"
        self.model_dir, self.train_steps = os.path.join(run_dir, "model_dir"), train_steps
        bindings = ["MnistTrainer.data_source='digits'", "MnistTrainer.filters=(8, 16)"]
        bindings += ["MnistTrainer.dense_units=32", f"Trainer.global_batch_size={batch}"]
        bindings += [f"train.train_steps={train_steps}", "train.log_every_n_steps=20"]
        bindings += ["train.checkpoint_every_n_steps=100"]
        cmd = [sys.executable, "-m", "tfdist_trainer.launch.main", *launch]
        cmd += ["--restart_policy=OnFailure", "--", f"--model_dir={self.model_dir}"]
        cmd += [f"--gin_file={_bench.REPO}/configs/{c}.gin" for c in ("mnist", strategy)]
        cmd += [f"--gin_bindings={b}" for b in bindings]
        os.makedirs(run_dir, exist_ok=True)
        self.out_path, self.t0 = os.path.join(run_dir, "launch.out"), time.monotonic()
        with open(self.out_path, "w") as out:
            io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            self.proc = subprocess.Popen(
                cmd, env=_bench.child_env(), cwd=_bench.REPO, start_new_session=True, **io
            )

    def output(self) -> str:
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def log_path(self, role: str) -> str:
        return os.path.join(self.model_dir, "logs", role.replace(":", "-") + ".log")

    def last_words(self) -> list[str]:
        """Every task's one-sentence error lines (`[chief:0] error: ...`), from all its lives: why a
        task ended, which the launcher's own lines (an exit code) do not say."""
        logs = os.path.join(self.model_dir, "logs")
        lines: list[str] = []
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            with open(os.path.join(logs, name), errors="replace") as f:
                lines += TASK_ERROR.findall(f.read())
        return lines

    def step(self) -> int:
        records = train_records(self.model_dir)
        return records[-1]["step"] if records else -1

    def pid(self, role: str) -> int | None:
        pids = [int(p) for r, p, _ in started_tasks(self.output()) if r == role]
        return pids[-1] if pids else None

    def wait_for(self, predicate, limit_s: float):
        """Polls `predicate` until it returns a true value; None if the job ends or time runs out."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            value = predicate()
            if value:
                return value
            time.sleep(0.5)
        return None

    def recovered(self, role: str, mark: int, step: int, limit_s: float) -> dict | None:
        """After a fault at `step` (the launcher's output then `mark` long): the launcher reacted,
        started again each task it restarts (and a ps or worker listens again), then a train
        record past `step` was written. Returns {"roles": the tasks restarted}, or None."""
        gone, state = re.compile(GONE.format(role=re.escape(role)), re.M), {}

        def back():
            out = self.output()[mark:]
            if "roles" not in state:
                found = RESTARTING.search(out)
                if not (found or gone.search(out)):
                    return None
                state["roles"] = found.group(1).split(", ") if found else []
                state["at"] = found.end() if found else 0
            if "since" not in state:
                started = {r: address for r, _, address in started_tasks(out[state["at"] :])}
                serving = [r for r in state["roles"] if r.split(":")[0] in ("ps", "worker")]
                missing = set(state["roles"]) - set(started)
                if missing or not all(listening(started[r]) for r in serving):
                    return None
                state["since"] = time.time()
            records = train_records(self.model_dir)
            return any(r["step"] > step and r["time"] >= state["since"] for r in records) and state

        return self.wait_for(back, limit_s)

    def finish(self, limit_s: float) -> tuple[int | str, float]:
        """Waits for the launcher's end: `limit_s`, and `limit_s` again each time training went on
        since (a slow machine is not a hung job; a job whose steps stop is). Then, or interrupted,
        stops it as a user would: SIGTERM (it tears its tasks down), then SIGKILL to it and to
        each task's own session."""
        code: int | str = "timeout"
        try:
            step = self.step()
            while code == "timeout":
                try:
                    code = self.proc.wait(timeout=limit_s)
                except subprocess.TimeoutExpired:
                    step, before = self.step(), step
                    if step <= before or not limit_s:
                        break
        finally:
            if self.proc.poll() is None:
                signal_group(self.proc, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=60)
                signal_group(self.proc, signal.SIGKILL)
                for _, pid, _ in started_tasks(self.output()):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(int(pid), signal.SIGKILL)
            self.proc.wait()
        return code, time.monotonic() - self.t0


def deal(job: Job, schedule: list[dict], recovery_s: float, say=print) -> list[dict]:
    """Deals `schedule`'s faults to `job`, each after the previous recovery and its wait."""
    dealt: list[dict] = []
    job.wait_for(lambda: job.step() >= 0, recovery_s)
    for n, fault in enumerate(schedule, 1):
        time.sleep(fault["wait_s"])
        pid, step = job.pid(fault["role"]), job.step()
        if job.proc.poll() is not None or not 0 <= step < 0.95 * job.train_steps:
            say(f"[chaos] fault {n} not dealt: training at step {step} of {job.train_steps}")
            break
        log_mark, mark = os.path.getsize(job.log_path(job.driver)), len(job.output())
        try:
            os.kill(pid, getattr(signal, fault["signal"]))
        except (ProcessLookupError, TypeError):  # the task had ended (or never started)
            say(f"[chaos] fault {n} skipped: {fault['role']} is not running")
            continue
        t, what = time.monotonic(), f"{fault['signal']} {fault['role']} at step {step}"
        back = job.recovered(fault["role"], mark, step, recovery_s)
        resumed = step
        if back and job.driver in back["roles"]:  # the driver restored a checkpoint, or none
            with open(job.log_path(job.driver), errors="replace") as f:
                f.seek(log_mark)
                found = re.findall(r"restored \S+ \(step (\d+)\)", f.read())
            resumed = int(found[-1]) if found else 0
        seconds = round(time.monotonic() - t, 1)
        dealt.append({**fault, "step": step, "recovered": bool(back), "resumed_from": resumed})
        dealt[-1].update(steps_lost=step - resumed, recovery_s=seconds)
        if not back:
            ended = "" if job.proc.poll() is None else f"; the job ended ({job.proc.returncode})"
            say(f"[chaos] fault {n}: {what}: NOT recovered within {recovery_s:g}s{ended}")
            break
        dealt[-1]["restarted"] = back["roles"]
        restarted = ", ".join(back["roles"]) or "nothing"
        what += f": back in {seconds}s (restarted {restarted}; resumed from {resumed})"
        say(f"[chaos] fault {n}: {what}")
    return dealt


def run_job(job_name, schedule, train_steps, run_dir, recovery_s=300.0, say=print) -> dict:
    """One run of `job_name` with `schedule`'s faults: exit code, counts, final step, wall time."""
    job = Job(job_name, train_steps, run_dir)
    try:
        faults = deal(job, schedule, recovery_s, say)
    except BaseException:
        job.finish(0)
        raise
    code, wall_s = job.finish(recovery_s + 2 * train_steps / RATE[job_name])
    out, records = job.output(), train_records(job.model_dir)
    return {
        "exit_code": code,
        "faults_dealt": len(faults),
        "faults_survived": len(faults) if code == 0 else sum(f["recovered"] for f in faults),
        "restarts": len(RESTARTING.findall(out)),
        "most_in_a_window": max(
            map(int, re.findall(r"\(restart (\d+)/\d+ within", out)), default=0
        ),
        "given_up": GIVEN_UP.findall(out),
        "steps_lost": sum(max(0, f["steps_lost"]) for f in faults),
        "final_step": records[-1]["step"] if records else None,
        "train_steps": train_steps,
        "wall_s": round(wall_s, 1),
        "faults": faults,
        "launcher_lines": re.findall(r"^\[launch\] .*$", out, re.M),
        "last_words": job.last_words(),
        "output": job.out_path,
    }


def counts(result: dict) -> dict:
    """`run_job`'s result without its long parts (each fault, the launcher's and tasks' lines)."""
    return {k: v for k, v in result.items() if k not in ("faults", "launcher_lines", "last_words")}


def run(args):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the job, then exit
    work = os.path.abspath(os.path.join(args.out, NAME))
    results, figures, rows = {}, [], []
    for name in args.jobs:
        kinds = KINDS[name][:3] if args.smoke else KINDS[name]  # smoke: SIGKILL, SIGTERM, SIGKILL
        schedule = plan(kinds, args.faults, args.seed, args.spacing_s, 3 if name == "mwms" else 2)
        # Each fault: its longest wait, and 5 s of training while a worker or the evaluator is back.
        steps = args.train_steps or 100 * math.ceil(
            RATE[name] * (10 + args.faults * (1.5 * args.spacing_s + 5)) / 100
        )
        print(f"[chaos] {name}: {steps} steps, schedule {json.dumps(schedule)}", flush=True)
        chaos = run_job(name, schedule, steps, f"{work}/{name}-chaos", args.recovery_s)
        print(f"[chaos] {name}: {json.dumps(counts(chaos))}", flush=True)
        free = run_job(name, [], steps, f"{work}/{name}-fault_free", args.recovery_s)
        ratio = chaos["wall_s"] / free["wall_s"]
        results[name] = {**chaos, "fault_free": free, "overhead_ratio": ratio}
        keys = ("faults_dealt", "faults_survived", "restarts", "most_in_a_window", "steps_lost")
        cells = [chaos[k] for k in keys]
        cells += [f"{chaos['final_step']}/{steps}", chaos["exit_code"], f"{chaos['wall_s']:.0f}"]
        cells += [f"{free['wall_s']:.0f} (exit {free['exit_code']})", f"{ratio:.2f}"]
        rows.append([name, *map(str, cells)])
        what = f"{name}: wall time, {chaos['faults_dealt']} faults"
        vs = ("fault-free (same run)", ratio, "time ratio", 1)
        figures.append(_bench.figure(what, chaos["wall_s"], "s", *vs))
    cols = ["job", "dealt", "survived", "restarts", f"most in {WINDOW_S:g}s", "steps lost"]
    cols += ["final step", "exit", "wall s"]
    _bench.record(
        args,
        header=f"chaos: {args.faults} faults per job, each {args.spacing_s:g}s (+0..50%) after the "
        f"previous recovery; OnFailure, the default budget ({LIMIT} restarts per {WINDOW_S:g}s)",
        columns=[*cols, "fault-free wall s", "time ratio"],
        rows=rows,
        notes=[f"launcher output, logs and model_dirs: {work}"],
        environment=_bench.environment(),
        results=results,
        figures=figures,
    )
    runs = [r for res in results.values() for r in (res, res["fault_free"])]
    if any(r["exit_code"] != 0 or r["final_step"] != r["train_steps"] for r in runs):
        _bench.exit_now(1)


if __name__ == "__main__":
    _bench.main(parse_args, None, run)
