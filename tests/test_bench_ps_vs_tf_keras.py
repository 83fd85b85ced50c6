"""benchmarks.ps_vs_tf_keras keeps working: --smoke on a real local cluster, against tf-keras 2 fit.

The benchmark makes its own tf-keras venv on first use (pip, from PyPI). The
test uses the benchmark's default, the repo's gitignored ``.venv-tfkeras``:
made once (a few seconds: a venv, a .pth to this venv's site-packages, one
~2 MB wheel) and reused by later runs and by the real benchmark, instead of a
fresh copy per test run under tmp_path. A stale or half-made one is rebuilt
(the stamp file), and concurrent makers take turns (a lock). No timing is
asserted.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest
from benchlib import FIGURE_KEYS, STATS_KEYS, load, run_smoke


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_ps_vs_tf_keras_smoke(tmp_path):
    out = str(tmp_path / "bench")
    stdout = run_smoke("benchmarks.ps_vs_tf_keras", out, timeout=400)
    assert "parameter_server Trainer vs tf-keras fit" in stdout
    payload = load(out, "ps_vs_tf_keras")
    assert payload["benchmark"] == "ps_vs_tf_keras" and payload["smoke"] is True
    assert payload["cluster"]["layout"] == {"chief": 1, "worker": 2, "ps": 1}
    assert set(payload["results"]) == {"trainer", "tf_keras_fit_spe", "tf_keras_fit_default"}
    k = payload["config"]["steps_per_loop"]
    results = payload["results"]
    for name, result in results.items():
        assert set(result) >= STATS_KEYS, name
        assert result["steps_per_s"] > 0 and result["repetitions"] == 1
        # Every variant trained on the real cluster, every step counted once, variables on the ps.
        assert result["steps_counted_exact"] is True, name
        run = result["runs"][0]
        assert run["variable_devices"] and all("/job:ps/" in d for d in run["variable_devices"]), (
            name
        )
    assert results["trainer"]["steps_per_loop"] == k
    assert results["tf_keras_fit_spe"]["steps_per_execution"] == k
    assert results["tf_keras_fit_default"]["steps_per_execution"] == 1
    assert (
        results["trainer"]["closures_per_call"] == results["tf_keras_fit_spe"]["closures_per_call"]
    )
    for name in ("tf_keras_fit_spe", "tf_keras_fit_default"):
        run = results[name]["runs"][0]
        # The baseline is tf-keras 2 alone: no keras 3, no tfdist_trainer in its chief.
        assert run["tf_keras"].split(".")[:2] == run["tensorflow"].split(".")[:2]
        assert run["keras_3_modules_imported"] == [] and run["tfdist_trainer_imported"] is False

    env_info = payload["environment"]
    assert env_info["tf_keras"] and env_info["tf_keras_importable_in_project_venv"] is False
    figures = {f["figure"]: f for f in payload["figures"]}
    assert len(figures) == 2
    for f in figures.values():
        assert set(f) >= FIGURE_KEYS and f["ratio"] > 0 and f["repetitions"] == 1
        assert len(f["spread"]) == 2
    headline = figures[f"parameter_server Trainer vs tf-keras fit (steps_per_execution={k})"]
    assert headline["target"] == ">= 1.2x" and isinstance(headline["meets_target"], bool)

    # tf-keras stays out of the project's venv; the cluster processes are gone.
    assert importlib.util.find_spec("tf_keras") is None
    for run in (r for result in results.values() for r in result["runs"]):
        for address in run.get("cluster", {}).get("worker", []) + run.get("cluster", {}).get(
            "ps", []
        ):
            host, port = address.rsplit(":", 1)
            with pytest.raises(OSError):
                socket.create_connection((host, int(port)), timeout=1).close()
