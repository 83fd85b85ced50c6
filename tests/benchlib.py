"""Helpers for the tests that smoke-run benchmarks/ as subprocesses (no timing is ever asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: What _bench.summarize puts in every timed result.
STATS_KEYS = {
    "steps",
    "repetitions",
    "times_s",
    "time_s_median",
    "time_s_min",
    "time_s_max",
    "steps_per_s",
    "steps_per_s_min",
    "steps_per_s_max",
}
#: What _bench.figure puts in every headline figure.
FIGURE_KEYS = {
    "figure",
    "value",
    "unit",
    "baseline",
    "ratio",
    "ratio_label",
    "repetitions",
    "spread",
    "target",
    "meets_target",
}


def run_benchmark(
    module: str, out: str, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    """`python -m <module> --out=<out> <args>` from the repo, output captured; the caller checks the exit code."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(
        [sys.executable, "-m", module, f"--out={out}", *args],
        check=False,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def run_smoke(module: str, out: str, *args: str, timeout: float = 240) -> str:
    """Runs a benchmark with --smoke, asserts it exited 0, returns its output."""
    proc = run_benchmark(module, out, "--smoke", *args, timeout=timeout)
    assert proc.returncode == 0, f"{module} exited {proc.returncode}:\n{proc.stdout[-5000:]}"
    return proc.stdout


def load(out: str, name: str) -> dict:
    with open(os.path.join(out, f"{name}.json")) as f:
        return json.load(f)


def check_figures(payload: dict, at_least: int = 1) -> list[dict]:
    """Every headline figure names its baseline, ratio, repetitions and spread."""
    figures = payload["figures"]
    assert len(figures) >= at_least, figures
    for f in figures:
        assert set(f) >= FIGURE_KEYS, f
        assert f["baseline"] and f["repetitions"] >= 1 and f["value"] > 0, f
        if f["spread"] is not None:
            assert len(f["spread"]) == 2 and f["spread"][0] <= f["spread"][1], f
    return figures
