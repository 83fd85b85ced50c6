"""benchmarks/mnist_time_to_accuracy keeps working: --smoke as a subprocess, on the offline digits set.

No timing is asserted; only that it exits 0, writes the JSON that reports read,
labels the data honestly, and that what it calls "reached" is consistent
(the step is an evaluation step and the accuracy there is at or above target).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from benchlib import FIGURE_KEYS, load, run_benchmark

NAME = "mnist_time_to_accuracy"


def _run(out: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_benchmark(f"benchmarks.{NAME}", out, *args, timeout=timeout)


@pytest.mark.timeout(300)
def test_time_to_accuracy_smoke(tmp_path):
    out = str(tmp_path / "bench")
    proc = _run(out, "--smoke", "--data_source=digits")
    assert proc.returncode == 0, f"{NAME} exited {proc.returncode}:\n{proc.stdout[-5000:]}"
    assert "NOT MNIST" in proc.stdout

    payload = load(out, NAME)
    assert payload["benchmark"] == NAME and payload["smoke"] is True
    assert {
        "command",
        "config",
        "dataset",
        "environment",
        "baseline",
        "results",
        "speedups",
        "trajectories",
        "figures",
    } <= set(payload)
    assert payload["dataset"]["is_mnist"] is False and "not MNIST" in payload["dataset"]["label"]
    assert payload["dataset"]["test_examples"] == 359
    cfg = payload["config"]
    every, target = cfg["eval_every"], cfg["target_accuracy"]
    assert payload["baseline"] == "fit_default" and set(payload["results"]) == {
        "trainer",
        "fit_default",
    }

    for name, result in payload["results"].items():
        assert result["repetitions"] == cfg["repeats"] == 1
        assert result["reached_in"] == 1, (name, result["best_accuracy_per_seed"])
        assert {
            "train_s_to_target",
            "wall_s_to_target",
            "cpu_s_to_target",
            "first_segment_train_s",
            "eval_s_per_pass",
            "steps_to_target_per_seed",
            "description",
        } <= set(result), name
        for run in result["runs"]:
            steps = [step for step, _ in run["evals"]]
            # One evaluation per interval, at every multiple of eval_every, and none after the target.
            assert steps == list(range(every, run["steps_run"] + 1, every)), (name, steps)
            assert run["reached"] and run["steps_to_target"] % every == 0
            assert run["steps_to_target"] == steps[-1] <= cfg["max_steps"]
            assert run["accuracy_at_target"] >= target
            assert all(acc < target for _, acc in run["evals"][:-1])
            assert 0 < run["train_s_to_target"] <= run["wall_s_to_target"]
        assert result["train_s_to_target"]["median"] > 0
    assert payload["results"]["fit_default"]["runs"][0]["steps_per_execution"] == 1
    # Each variant ran in a process of its own, and the device is recorded.
    pids = {name: r["runs"][0]["process"] for name, r in payload["results"].items()}
    assert len(set(pids.values())) == 2, pids
    assert cfg["process_layout"].startswith("one process per variant")
    assert payload["environment"]["device"]["cpu_model"]
    assert isinstance(payload["environment"]["device"]["gpus"], list)

    for key in ("train_s_to_target", "wall_s_to_target", "cpu_s_to_target"):
        assert payload["speedups"][key]["pairs"] == 1 and payload["speedups"][key]["median"] > 0
    figures = payload["figures"]
    assert len(figures) == 2
    for fig in figures:
        assert set(fig) >= FIGURE_KEYS
        assert "NOT MNIST" in fig["figure"] and fig["unit"] == "s" and fig["value"] > 0
        assert fig["ratio"] > 0 and len(fig["spread"]) == 2 and fig["repetitions"] == 1
        assert "fit" in fig["baseline"]


@pytest.mark.timeout(120)
def test_time_to_accuracy_bad_args(tmp_path):
    out = str(tmp_path / "bench")
    for args in (
        ["--target_accuracy=1.5"],
        ["--eval_every=0"],
        ["--max_steps=10", "--eval_every=50"],
        ["--data_source=idx"],
        ["--filters=4"],
    ):
        proc = _run(out, *args, timeout=60)
        assert proc.returncode == 2 and "error:" in proc.stdout, (args, proc.stdout[-2000:])
    assert not os.path.exists(out)


def _fake_run(seed, reached, step=None, train_s=None):
    evals = [[50, 0.9], [100, 0.98]] if reached else [[50, 0.9], [100, 0.95]]
    return {
        "seed": seed,
        "reached": reached,
        "steps_to_target": step,
        "accuracy_at_target": 0.98 if reached else None,
        "train_s_to_target": train_s,
        "wall_s_to_target": train_s and train_s + 0.5,
        "cpu_s_to_target": train_s and train_s * 1.5,
        "first_segment_train_s": 1.0,
        "steps_run": 100,
        "train_s_total": 2.0,
        "eval_s_total": 0.4,
        "wall_s_total": 2.4,
        "best_accuracy": max(a for _, a in evals),
        "target_accuracy": 0.97,
        "evals": evals,
        "setup_s": 0.1,
    }


def test_time_to_accuracy_not_reached_is_reported_honestly():
    """A target missed in some repetition gives no value and says so; speedups use only paired reaches."""
    from benchmarks import mnist_time_to_accuracy as bench

    args = bench.parse_args(["--repeats=2", "--max_steps=100", "--data_source=digits"])
    runs = {
        "trainer": [_fake_run(0, True, 100, 2.0), _fake_run(1, False)],
        "fit_default": [_fake_run(0, True, 100, 3.0), _fake_run(1, True, 100, 3.5)],
    }
    results = {name: bench.summarize_variant(name, runs[name], args) for name in bench.VARIANTS}
    dataset = {"short_name": "offline digits fallback (NOT MNIST)"}
    speedups = {k: bench.paired_speedups(results, k) for k in bench.SPEEDUP_KEYS}
    assert speedups["train_s_to_target"]["pairs"] == 1
    assert speedups["train_s_to_target"]["median"] == 1.5
    figures = bench.make_figures(args, dataset, results, speedups)
    assert all(f["value"] is None and "NOT REACHED" in f["figure"] and "note" in f for f in figures)
    assert all("NOT MNIST" in f["figure"] for f in figures)
    (note,) = bench.notes(args, results)
    assert note.startswith("trainer: target 0.97 NOT reached within --max_steps=100 in 1 of 2")
