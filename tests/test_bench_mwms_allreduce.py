"""benchmarks/mwms_allreduce.py keeps working: --smoke on a real 2-worker multi_worker_mirrored cluster.

No timing is asserted; only that it exits 0, writes the JSON that reports read,
all-reduces exactly the model's gradient bytes, and that its collectives sum
correctly.
"""

from __future__ import annotations

import socket

import pytest
from benchlib import FIGURE_KEYS, load, run_smoke
from benchlib import STATS_KEYS as SUMMARY_KEYS

STATS_KEYS = SUMMARY_KEYS | {
    "time_per_unit_ms_median",
    "time_per_unit_ms_min",
    "time_per_unit_ms_max",
}
VARIANTS = {
    "train_step",
    "local_step",
    "allreduce",
    "raw_collective",
    "raw_per_tensor",
    "raw_scalar",
}


def _recipe_cnn_params(filters: tuple[int, int], dense: int) -> list[int]:
    """Parameter counts of recipes/mnist's CNN (28x28x1 -> conv3 -> pool2 -> conv3 -> pool2 -> dense -> 10)."""
    f1, f2 = filters
    side = ((28 - 2) // 2 - 2) // 2
    return [9 * 1 * f1, f1, 9 * f1 * f2, f2, side * side * f2 * dense, dense, dense * 10, 10]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_mwms_allreduce_smoke(tmp_path):
    out = str(tmp_path / "bench")
    stdout = run_smoke("benchmarks.mwms_allreduce", out, timeout=280)
    assert "raw_collective" in stdout and "wrote" in stdout
    payload = load(out, "mwms_allreduce")
    assert payload["benchmark"] == "mwms_allreduce" and payload["smoke"] is True
    assert {
        "command",
        "config",
        "environment",
        "cluster",
        "gradient_bytes",
        "num_tensors",
        "gradient_tensors",
        "results",
        "ratios",
        "figures",
        "checks",
        "train_loop_collectives",
    } <= set(payload)
    assert payload["baseline"] == "raw_collective"
    assert payload["config"]["num_workers"] == 2 and len(payload["cluster"]["worker"]) == 2
    assert "load_average_1m_driver_start" in payload["environment"]

    # The bytes all-reduced are the model's trainable bytes (float32), computed here independently.
    cfg = payload["config"]
    expected = _recipe_cnn_params(tuple(cfg["filters"]), cfg["dense_units"])
    assert payload["num_tensors"] == len(expected) == len(payload["gradient_tensors"])
    assert payload["gradient_bytes"] == 4 * sum(expected)
    shapes_bytes = 0
    for t in payload["gradient_tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        shapes_bytes += n * 4
        assert t["dtype"] == "float32" and t["bytes"] == n * 4
    assert shapes_bytes == payload["gradient_bytes"]
    assert payload["flat_float32_elements"] * 4 == payload["gradient_bytes"]
    # The strategy packs all gradients into one collective per step (plus, once per call, TrainLoop's loss).
    traced = [c["bytes"] for c in payload["train_loop_collectives"]]
    assert payload["gradient_bytes"] in traced, payload["train_loop_collectives"]

    # Every collective summed what the two workers contributed, on both workers.
    assert payload["raw_collective_checked"] is True and payload["allreduce_checked"] is True
    assert set(payload["checks"]) == {"worker:0", "worker:1"}
    for checks in payload["checks"].values():
        assert all(
            checks[f"{v}_checked"]
            for v in ("allreduce", "raw_collective", "raw_per_tensor", "raw_scalar")
        )

    assert set(payload["results"]) == VARIANTS
    for name, r in payload["results"].items():
        assert set(r) >= STATS_KEYS, name
        assert r["repetitions"] == cfg["repeats"] == 1
        assert r["time_per_unit_ms_median"] > 0
        assert r["unit"] == ("step" if name in ("train_step", "local_step") else "all-reduce")
    assert payload["results"]["raw_collective"]["time_ratio_vs_raw_collective"] == 1.0
    # The one_device comparison ran in a process of its own, not beside the MWMS run.
    assert payload["results"]["local_step"]["process"].startswith("own process")
    # ... and so did each worker's MWMS train step, in a second cluster of its own.
    assert "second cluster" in payload["results"]["train_step"]["process"]
    assert payload["environment"]["device"]["cpu_model"]
    assert {
        "allreduce_over_raw_collective",
        "train_step_over_local_step",
        "communication_ms_per_step",
        "communication_share_of_step",
        "allreduce_share_of_step",
        "train_step_over_budget",
    } <= set(payload["ratios"])
    # Issue 11's budget, checked for each worker from its own times.
    budgets = [f for f in payload["figures"] if f["target"] == "<= 1.0"]
    assert [f["key"] for f in budgets] == [
        "issue11_mwms_budget_worker0",
        "issue11_mwms_budget_worker1",
    ]
    for budget in budgets:
        assert isinstance(budget["meets_target"], bool) and budget["ratio"] > 0
    assert (
        payload["global_step"]
        == cfg["warmup_steps"]
        + min(cfg["warmup_steps"], cfg["steps_per_loop"])
        + cfg["repeats"] * cfg["steps"]
    )

    figures = payload["figures"]
    assert len(figures) >= 3
    for fig in figures:
        assert set(fig) >= FIGURE_KEYS, fig
        assert fig["baseline"] and fig["repetitions"] == 1
        assert fig["ratio"] is not None and len(fig["spread"]) == 2
    names = " | ".join(fig["figure"] for fig in figures)
    assert (
        "raw collective" in names
        and "local step" in names
        and f"{payload['gradient_bytes']:,} B" in names
    )

    # Both workers are gone: nothing listens on their ports any more.
    for address in payload["cluster"]["worker"]:
        host, port = address.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()
