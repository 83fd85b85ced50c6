"""benchmarks.click_vs_tf_keras keeps working: --smoke on a real local cluster (chief + 2 workers +
2 ps), the click recipe's Trainer against tf-keras 2 fit over `Embedding` tables sharded by TF's
`variable_partitioner`. The tf-keras venv is ps_vs_tf_keras's (made once, reused). No timing is
asserted: that every step ran on the cluster with the tables on the ps, both ways of building
the model saw the same sizes, and the bytes each way were read from the ps' own connections."""

from __future__ import annotations

import importlib.util

import pytest
from benchlib import FIGURE_KEYS, STATS_KEYS, load, run_smoke


@pytest.mark.cluster
@pytest.mark.timeout(420)
def test_click_vs_tf_keras_smoke(tmp_path):
    out = str(tmp_path / "bench")
    stdout = run_smoke(
        "benchmarks.click_vs_tf_keras", out, "--variants=trainer,tf_keras_fit_spe", timeout=400
    )
    assert "Trainer vs tf-keras fit" in stdout
    payload = load(out, "click_vs_tf_keras")
    assert payload["benchmark"] == "click_vs_tf_keras" and payload["smoke"] is True
    assert payload["cluster"]["layout"] == {"chief": 1, "worker": 2, "ps": 2}
    assert len(payload["model"]["vocab_sizes"]) == 26
    results = payload["results"]
    assert set(results) == {"trainer", "tf_keras_fit_spe"}
    for name, result in results.items():
        assert set(result) >= STATS_KEYS, name
        assert result["examples_per_s"] > 0 and result["steps_counted_exact"] is True, name
        # Both directions carry at least the looked-up rows back and the ids there.
        assert result["to_ps_bytes_per_step"] > 0 and result["from_ps_bytes_per_step"] > 0, name
        run = result["runs"][0]
        devices = run["variable_devices"]
        assert {d.split("/task:")[0] for d in devices} == {"/job:ps/replica:0"}, (name, devices)
        assert len({d.split("/device:")[0] for d in devices}) == 2, (name, devices)  # both ps
    baseline = results["tf_keras_fit_spe"]["runs"][0]
    # The baseline is tf-keras 2 alone, its big tables cut in shards by the partitioner.
    assert baseline["keras_3_modules_imported"] == [] and not baseline["tfdist_trainer_imported"]
    assert baseline["table_shards"] > 26
    (figure,) = payload["figures"]
    assert set(figure) >= FIGURE_KEYS and figure["target"] == ">= 1.5x"
    assert importlib.util.find_spec("tf_keras") is None
