"""The benchmarks keep working: each runs in --smoke mode (tiny sizes) as a subprocess.

No timing is asserted; only that they exit 0 and write JSON with the keys that
reports and tools read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STATS_KEYS = {"steps", "repetitions", "times_s", "time_s_median", "time_s_min", "time_s_max",
              "steps_per_s", "steps_per_s_min", "steps_per_s_max"}


def _run(module: str, out: str, *args: str, timeout: float = 240) -> str:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-m", module, "--smoke", f"--out={out}", *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{module} exited {proc.returncode}:\n{proc.stdout[-5000:]}"
    return proc.stdout


def _load(out: str, name: str) -> dict:
    with open(os.path.join(out, f"{name}.json")) as f:
        return json.load(f)


@pytest.mark.timeout(300)
def test_run_all_smoke_runs_trainer_vs_baselines(tmp_path):
    out = str(tmp_path / "bench")
    stdout = _run("benchmarks.run_all", out, "--only=trainer_vs_baselines")
    assert "combined benchmark results" in stdout

    payload = _load(out, "trainer_vs_baselines")
    assert payload["benchmark"] == "trainer_vs_baselines" and payload["smoke"] is True
    assert payload["baseline"] == "handwritten"
    assert set(payload["results"]) == {"trainer", "handwritten", "fit_default", "fit_spe100"}
    for name, result in payload["results"].items():
        assert STATS_KEYS <= set(result), name
        assert {"time_ratio_vs_baseline", "time_ratio_vs_baseline_paired", "description"} <= set(result), name
        assert result["steps_per_s"] > 0
    assert payload["results"]["handwritten"]["time_ratio_vs_baseline"] == 1.0
    assert payload["results"]["fit_spe100"]["steps_per_execution"] == payload["config"]["steps_per_loop"]
    assert {"trainer_over_handwritten_time", "trainer_over_handwritten_meets_target",
            "trainer_speedup_vs_fit_default", "trainer_speedup_vs_fit_default_meets_target",
            "trainer_speedup_vs_fit_spe100"} <= set(payload["summary"])

    combined = _load(out, "run_all")
    assert combined["status"]["trainer_vs_baselines"]["exit_code"] == 0
    assert len(combined["rows"]) == 4 and combined["headlines"]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_ps_steps_per_loop_smoke(tmp_path):
    out = str(tmp_path / "bench")
    _run("benchmarks.ps_steps_per_loop", out)

    payload = _load(out, "ps_steps_per_loop")
    assert payload["benchmark"] == "ps_steps_per_loop" and payload["smoke"] is True
    assert payload["baseline"] == "steps_per_loop=1"
    assert [r["steps_per_loop"] for r in payload["results"]] == [1, 10, 100]
    for result in payload["results"]:
        assert STATS_KEYS <= set(result)
        assert {"steps_per_call", "closures_per_call", "speedup_vs_baseline", "speedup_vs_baseline_paired"} <= set(result)
        assert result["steps_per_s"] > 0
    assert payload["results"][0]["speedup_vs_baseline"] == 1.0
    # The real cluster trained: every scheduled step was counted once.
    assert payload["global_step_exact"] is True
    assert payload["recommendation"]["steps_per_loop"] in (1, 10, 100)
    # The ps and worker tasks it started are gone: nothing listens on their ports any more.
    for task_type in ("ps", "worker"):
        for address in payload["cluster"][task_type]:
            host, port = address.rsplit(":", 1)
            with pytest.raises(OSError):
                socket.create_connection((host, int(port)), timeout=1).close()
