"""The benchmarks keep working: each runs in --smoke mode (tiny sizes) as a subprocess.

No timing is asserted; only that they exit 0 and write JSON with the keys that
reports and tools read.

A smoke run is each benchmark's cheapest run that still goes through all of
its code (every variant, the report, the JSON; run_all also the chart): almost
all of its time is TensorFlow starting in each process, so --smoke starts no
process that no assertion needs, starts a benchmark's VariantProcesses all at
once, and starts a cluster's chief beside its ps and worker tasks. Each of
run_all's benchmarks is smoke-run once in the suite: trainer_vs_baselines,
steps_per_loop_auto and mirrored_vs_one_device through run_all (below), the
others by tests of their own (here and in tests/test_bench_*.py).
"""

from __future__ import annotations

import os
import socket

import pytest
from benchlib import STATS_KEYS, check_figures, load, run_benchmark, run_smoke


@pytest.mark.timeout(420)
def test_run_all_smoke_runs_the_in_process_benchmarks(tmp_path):
    out = str(tmp_path / "bench")
    stdout = run_smoke(
        "benchmarks.run_all",
        out,
        "--only=trainer_vs_baselines,steps_per_loop_auto,mirrored_vs_one_device",
        timeout=400,
    )
    assert "tfdist_trainer benchmarks (SMOKE" in stdout
    # Issue 11's targets are listed after the table, each with its target and met / NOT met.
    assert "== issue 11 targets" in stdout

    payload = load(out, "trainer_vs_baselines")
    assert payload["benchmark"] == "trainer_vs_baselines" and payload["smoke"] is True
    assert payload["baseline"] == "handwritten"
    assert set(payload["results"]) == {"trainer", "handwritten", "fit_default", "fit_spe100"}
    for name, result in payload["results"].items():
        assert set(result) >= STATS_KEYS, name
        assert {"time_ratio_vs_baseline", "time_ratio_vs_baseline_paired", "description"} <= set(
            result
        ), name
        assert result["steps_per_s"] > 0
    assert payload["results"]["handwritten"]["time_ratio_vs_baseline"] == 1.0
    assert (
        payload["results"]["fit_spe100"]["steps_per_execution"]
        == payload["config"]["steps_per_loop"]
    )
    assert {
        "trainer_over_handwritten_time",
        "trainer_over_handwritten_meets_target",
        "trainer_speedup_vs_fit_default",
        "trainer_speedup_vs_fit_default_meets_target",
        "trainer_speedup_vs_fit_spe100",
    } <= set(payload["summary"])
    targets = {f["target"] for f in check_figures(payload, at_least=3)}
    assert {"<= 1.05", ">= 1.4", ">= 0.9"} <= targets
    assert payload["isolation"]["steps_per_s"] > 0 and isinstance(
        payload["isolation"]["meets_target"], bool
    )

    auto = load(out, "steps_per_loop_auto")
    assert set(auto["results"]) == {"fixed_1", "fixed_10", "auto"}
    assert auto["results"]["auto"]["steps_per_loop"] >= 1
    assert auto["summary"]["best_fixed"] in ("fixed_1", "fixed_10")
    (figure,) = check_figures(auto)
    assert figure["target"] == ">= 0.9" and isinstance(figure["meets_target"], bool)

    mirrored = load(out, "mirrored_vs_one_device")
    assert (
        mirrored["results"]["mirrored"]["replicas"] == 2
        and mirrored["results"]["one_device"]["replicas"] == 1
    )
    assert len(mirrored["devices"]) == 2
    check_figures(mirrored)

    combined = load(out, "run_all")
    assert all(st["exit_code"] == 0 for st in combined["status"].values())
    assert set(combined["status"]) == {
        "trainer_vs_baselines",
        "steps_per_loop_auto",
        "mirrored_vs_one_device",
    }
    assert len(combined["rows"]) == len(combined["figures"]) >= 5
    issue_11 = {row["key"]: row for row in combined["issue_11"]}
    for key in (
        "issue11_trainer_vs_handwritten",
        "issue11_trainer_vs_fit_default",
        "issue11_isolation",
    ):
        assert issue_11[key]["ratio"] > 0 and issue_11[key]["result"] in ("met", "NOT met"), key
    assert issue_11["issue11_mwms_budget_worker0"]["result"].startswith("not run")
    assert issue_11["issue11_ps_vs_tf_keras"]["target"] == ">= 1.2x"
    # Every benchmark recorded the device it ran on.
    assert set(combined["devices"]) == set(combined["status"])
    assert all(combined["devices"].values()), combined["devices"]
    for name in combined["status"]:
        device = load(out, name)["environment"]["device"]
        assert device["cpu_model"] and isinstance(device["gpus"], list), name
    with open(combined["chart"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    # --report_only rebuilds the combined report from the JSON files, running nothing.
    os.remove(combined["chart"])
    stdout = run_smoke(
        "benchmarks.run_all",
        out,
        "--report_only",
        "--only=trainer_vs_baselines,steps_per_loop_auto",
        timeout=120,
    )
    assert "trainer_vs_baselines: ok (from its JSON)" in stdout and "[run_all] -m" not in stdout
    rebuilt = load(out, "run_all")
    assert rebuilt["smoke"] is True and os.path.exists(rebuilt["chart"])
    assert len(rebuilt["figures"]) == len(combined["figures"]) - len(mirrored["figures"])


def test_run_all_refuses_an_unknown_benchmark(tmp_path):
    proc = run_benchmark("benchmarks.run_all", str(tmp_path), "--only=nope", timeout=60)
    assert proc.returncode == 2
    assert "--only: unknown nope" in proc.stdout


def test_run_all_report_only_without_results_says_to_run_first(tmp_path):
    proc = run_benchmark(
        "benchmarks.run_all", str(tmp_path), "--report_only", "--only=ps_ratios", timeout=120
    )
    assert proc.returncode == 1, proc.stdout
    assert (
        f"ps_ratios FAILED: it wrote no {tmp_path}/ps_ratios.json; run it first (without --report_only)"
        in proc.stdout
    )


def test_run_all_exits_1_when_a_benchmark_fails(tmp_path):
    # A bad argument makes the benchmark itself exit 2; run_all reports it and exits 1.
    proc = run_benchmark(
        "benchmarks.run_all",
        str(tmp_path),
        "--only=steps_per_loop_auto",
        "--args=steps_per_loop_auto=--fixed=0",
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout
    assert "steps_per_loop_auto FAILED with exit code 2" in proc.stdout
    assert "--fixed needs positive integers" in proc.stdout


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_ps_steps_per_loop_smoke(tmp_path):
    out = str(tmp_path / "bench")
    # Three values (two fixed, so the recommendation has a choice, and 'auto'): each is a
    # cluster of its own, and a fourth would prove nothing more.
    run_smoke("benchmarks.ps_steps_per_loop", out, "--steps_per_loop=1,10,auto")

    payload = load(out, "ps_steps_per_loop")
    assert payload["benchmark"] == "ps_steps_per_loop" and payload["smoke"] is True
    assert payload["baseline"] == "steps_per_loop=1"
    assert [r["steps_per_loop"] for r in payload["results"]] == [1, 10, "auto"]
    for result in payload["results"]:
        assert set(result) >= STATS_KEYS
        assert {
            "steps_per_call",
            "closures_per_call",
            "speedup_vs_baseline",
            "speedup_vs_baseline_paired",
        } <= set(result)
        assert result["steps_per_s"] > 0
    assert payload["results"][0]["speedup_vs_baseline"] == 1.0
    # Each steps_per_loop value had a cluster (and chief process) of its own.
    assert payload["config"]["process_layout"].startswith("one cluster and chief process per")
    assert len(payload["clusters"]) == 3
    ports = [tuple(c["worker"] + c["ps"]) for c in payload["clusters"].values()]
    assert payload["cluster"] in payload["clusters"].values()
    assert all(len(p) == 3 for p in ports)
    # The real cluster trained: every scheduled step was counted once.
    assert payload["global_step_exact"] is True
    assert payload["recommendation"]["steps_per_loop"] in (1, 10)
    auto = [f for f in check_figures(payload, at_least=2) if "'auto'" in f["figure"]]
    assert len(auto) == 1 and auto[0]["target"] == ">= 0.9"
    # The ps and worker tasks it started are gone: nothing listens on their ports any more.
    for task_type in ("ps", "worker"):
        for address in {a for c in payload["clusters"].values() for a in c[task_type]}:
            host, port = address.rsplit(":", 1)
            with pytest.raises(OSError):
                socket.create_connection((host, int(port)), timeout=1).close()


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_ps_ratios_smoke(tmp_path):
    out = str(tmp_path / "bench")
    run_smoke("benchmarks.ps_ratios", out, "--layouts=1:1,1:2", timeout=380)
    payload = load(out, "ps_ratios")
    assert payload["baseline"] == "ps:worker 1:1"
    assert {name: (r["num_ps"], r["num_workers"]) for name, r in payload["results"].items()} == {
        "1:1": (1, 1),
        "1:2": (1, 2),
    }
    assert payload["global_step_exact"] is True
    (figure,) = check_figures(payload)
    assert figure["baseline"] == "ps:worker 1:1"


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_sharded_embedding_smoke_has_an_unsharded_baseline(tmp_path):
    out = str(tmp_path / "bench")
    run_smoke("benchmarks.sharded_embedding", out, timeout=280)
    payload = load(out, "sharded_embedding")
    tiny, base = payload["results"]["tiny"], payload["baselines"]["tiny"]
    assert tiny["num_shards"] > base["num_shards"]  # two shards per table on 2 ps, against one
    assert tiny["table_parameters"] == base["table_parameters"]
    assert 0 < tiny["estimated_bytes_moved_per_step"] < tiny["dense_read_bytes_per_step"]
    units = [f["unit"] for f in check_figures(payload, at_least=2)]
    assert units == ["steps/s", "bytes/step"]


@pytest.mark.timeout(480)
def test_model_parallel_smoke(tmp_path):
    out = str(tmp_path / "bench")
    # Two devices are enough for what this checks (mp2 and mp2_pipelined against one_device); the
    # default --devices=2,4 starts two more variant processes for no extra assertion.
    run_smoke("benchmarks.model_parallel", out, "--devices=2", timeout=280)
    payload = load(out, "model_parallel")
    assert {"one_device", "mp2", "mp2_pipelined"} <= set(payload["results"])
    figures = check_figures(payload, at_least=2)
    assert all(f["baseline"].startswith("one_device") for f in figures)

    # keras-hub's GPT-2 (its default --micro_batches=4,8), each variant named by model and depth;
    # each model_parallel variant reports the bytes its placement put on each device.
    out = str(tmp_path / "bench_gpt2")
    run_smoke("benchmarks.model_parallel", out, "--devices=2", "--model=gpt2", timeout=180)
    payload = load(out, "model_parallel")
    names = ["one_device", "mp2", "mp2_pipelined_mb4", "mp2_pipelined_mb8"]
    assert list(payload["results"]) == [f"gpt2_L2_{n}" for n in names]
    for r in list(payload["results"].values())[1:]:
        assert [d["bytes"] > 0 for d in r["per_device"]] == [True, True], r
        assert sum(d["share"] for d in r["per_device"]) == pytest.approx(1.0)
    figures = check_figures(payload, at_least=3)
    assert [f["target"] is not None for f in figures] == [False, True, True]


def test_data_service_smoke_compares_with_static_shards_in_the_same_run(tmp_path):
    out = str(tmp_path / "bench")
    stdout = run_smoke("benchmarks.data_service", out, timeout=280)
    payload = load(out, "data_service")
    assert payload["baseline"] == "static" and set(payload["results"]) == {"static", "served"}
    assert all(r["steps_per_s"] > 0 for r in payload["results"].values())
    (figure,) = check_figures(payload)
    assert figure["ratio"] == payload["results"]["served"]["ratio_to_static"] > 0
    assert "x static" in stdout
