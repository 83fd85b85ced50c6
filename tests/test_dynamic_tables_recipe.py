"""The click recipe with dynamic tables on a real cluster (chief, 2 workers, 2 ps through
tfdist-launch): the train records count each table's and shard's rows; `--mode=export`,
ExportSavedModel and BestExporter write SavedModels that a clean process serves with stock
TensorFlow on raw keys, with the trained model's predictions; the 2-ps checkpoint resumes on 3 ps.
Bad input is one sentence and exit 2: a checkpoint of fixed tables restored into dynamic ones (and
the reverse), a capacity below one batch's new keys, a strategy that cannot hold the tables."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from clusterlib import (
    REPO,
    assert_one_error_line,
    launch_cmd,
    read_records,
    run,
    strategy_gin,
    train_cmd,
)
from servinglib import (
    assert_each_weight_exported_once,
    checkpoint_reference,
    run_in_repo,
    serve_in_clean_process,
)

pytestmark = pytest.mark.cluster

DYNAMIC_TINY = f"{REPO}/configs/sharded_embedding/dynamic_tiny.gin"
STEPS = 60  # dynamic_tiny.gin's train.train_steps


def _launch(model_dir: str, num_ps: int, binding: str) -> str:
    """tfdist-launch of dynamic_tiny.gin, chief + 2 workers + `num_ps` ps; its console output."""
    result = run(
        launch_cmd(
            ["--num_workers=2", f"--num_ps={num_ps}"],
            [
                f"--gin_file={DYNAMIC_TINY}",
                strategy_gin("parameter_server"),
                f"--model_dir={model_dir}",
                f"--gin_bindings={binding}",
            ],
        ),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout


@pytest.fixture(scope="module")
def two_ps_run(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("dynamic") / "model")
    # The exports at the end of training: the same path as --mode=export.
    stdout = _launch(model_dir, 2, "train.extra_hooks=[@ExportSavedModel(), @BestExporter()]")
    return model_dir, stdout


def test_the_train_records_and_the_progress_line_count_each_tables_rows(two_ps_run):
    model_dir, stdout = two_ps_run
    train = [r for r in read_records(model_dir) if r["kind"] == "train"]
    assert train[-1]["step"] == STEPS, train
    last = train[-1]
    # table_5 draws ids below 100: every id seen twice has its own row, nothing evicted.
    assert 0 < last["table_5/rows_in_use"] <= 100, last
    assert (
        last["table_5/shard_0/rows_in_use"] + last["table_5/shard_1/rows_in_use"]
        == (last["table_5/rows_in_use"])
    )
    # table_0 draws ids below 4,000 into 512 rows: full shards evict their rarest rows.
    assert last["table_0/evicted"] > 0, last
    assert last["table_0/rows_in_use"] <= 512 < last["table_0/admitted"], last
    # All tables' totals on the progress line, the tables and shards in the records.
    assert re.search(
        rf"step {STEPS}/{STEPS} .* dynamic_rows=\d+ admitted=\d+ evicted=[1-9]", stdout
    )


def test_a_two_ps_run_exports_a_model_that_a_clean_process_serves_on_raw_keys(two_ps_run):
    model_dir, _ = two_ps_run
    checkpoint = os.path.join(model_dir, f"ckpt-{STEPS}")
    export = run(
        train_cmd(
            f"--gin_file={DYNAMIC_TINY}",
            strategy_gin("parameter_server"),
            f"--model_dir={model_dir}",
            "--mode=export",
        ),
        timeout=180,
    )
    assert export.returncode == 0, export.stdout[-4000:]
    # The reference: the model on the training run's 2 shards (the export holds 1), its checkpoint.
    inputs, expected, state_bytes = checkpoint_reference(
        [DYNAMIC_TINY], ["ClickTrainer.num_shards=2"], checkpoint, examples=1000, unseen=300
    )
    # --mode=export, ExportSavedModel and BestExporter (step 60 is the only evaluation: the best).
    for name in (f"ckpt-{STEPS}", str(STEPS), "best_eval_loss"):
        export_dir = os.path.join(model_dir, "export", name)
        if name == "best_eval_loss":
            (export_dir,) = [
                os.path.join(export_dir, d) for d in os.listdir(export_dir) if d.isdigit()
            ]
        served, ops = serve_in_clean_process(export_dir, inputs)
        assert served.shape == expected.shape == (1000, 1)
        np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5, err_msg=name)
        assert "LookupTableFindV2" in ops, ops  # the raw keys are looked up in the served model
        # The served graph only reads: none of the training step's locking and bookkeeping.
        assert not any("Critical" in op or "MutexLock" in op for op in ops), ops
        # Each weight once, the pools and the key -> row tables (whole: their free buckets too).
        assert_each_weight_exported_once(export_dir, state_bytes)
    # The model back in Python (tfdist_trainer.load_model), on one device: the same predictions.
    np.testing.assert_allclose(_loaded_model_predictions(model_dir, inputs), expected, atol=1e-5)


_LOAD_MODEL = """
import json, sys
import numpy as np
import tfdist_trainer

model_dir, gin_file, inputs_path, out_path = sys.argv[1:]
model = tfdist_trainer.load_model(model_dir=model_dir, gin_files=[gin_file])
inputs = dict(np.load(inputs_path))
np.save(out_path, np.asarray(model(inputs, training=False)))
"""


def _loaded_model_predictions(model_dir: str, inputs: dict) -> np.ndarray:
    scratch = os.path.join(model_dir, "load_model")
    os.makedirs(scratch, exist_ok=True)
    np.savez(os.path.join(scratch, "inputs.npz"), **inputs)
    out = os.path.join(scratch, "predictions.npy")
    run_in_repo(_LOAD_MODEL, model_dir, DYNAMIC_TINY, f"{scratch}/inputs.npz", out)
    return np.load(out)


def test_a_two_ps_checkpoint_resumes_on_three_ps_with_its_keys_rehashed(two_ps_run):
    model_dir, _ = two_ps_run
    before = [r for r in read_records(model_dir) if r["kind"] == "train"]
    stdout = _launch(model_dir, 3, f"train.train_steps={STEPS + 20}")
    assert re.search(rf"restored \S*ckpt-{STEPS} \(step {STEPS}\)", stdout), stdout[-4000:]
    after = [r for r in read_records(model_dir) if r["kind"] == "train"][len(before) :]
    assert after[0]["step"] == STEPS + 20, after
    last = after[-1]
    # Every table now has 3 shards, and the keys it had stay (the 3 shards hold them all).
    assert "table_0/shard_2/rows_in_use" in last, sorted(last)
    assert last["table_0/rows_in_use"] == sum(
        last[f"table_0/shard_{i}/rows_in_use"] for i in range(3)
    )
    assert last["table_0/admitted"] >= before[-1]["table_0/admitted"], (last, before[-1])
    # Training goes on from where it was, not from scratch.
    assert last["loss"] < before[0]["loss"], (last, before[0])


@pytest.mark.parametrize("first, then", [("dynamic", "fixed"), ("fixed", "dynamic")])
def test_a_checkpoint_of_one_table_kind_restored_into_the_other_is_one_sentence(
    tmp_path, first, then
):
    kinds = {"dynamic": [], "fixed": ["--gin_bindings=ClickTrainer.dynamic_capacity=None"]}
    common = [
        f"--gin_file={DYNAMIC_TINY}",
        strategy_gin("one_device"),
        f"--model_dir={tmp_path / 'model'}",
        "--gin_bindings=train.train_steps=2",
        "--gin_bindings=ClickTrainer.eval_batches=1",
    ]
    trained = run(train_cmd(*common, *kinds[first]), timeout=180)
    assert trained.returncode == 0, trained.stdout[-4000:]
    result = run(train_cmd(*common, *kinds[then]), timeout=180)
    named = {"dynamic": "DynamicEmbedding tables (rows by key)", "fixed": "fixed-size"}
    assert_one_error_line(
        result, 2, f"holds {named[first]}", "cannot be restored as the other", "new model_dir"
    )


def test_a_capacity_below_one_batchs_new_keys_is_one_sentence_first_and_few_lines(tmp_path):
    # Under parameter_server the check fails on a ps, and every task's aborted transfers repeat
    # it (with gRPC details): the chief's sentence comes first, the rest is one count.
    result = run(
        launch_cmd(
            ["--num_workers=2", "--num_ps=2"],
            [
                f"--gin_file={DYNAMIC_TINY}",
                strategy_gin("parameter_server"),
                f"--model_dir={tmp_path / 'model'}",
                "--gin_bindings=ClickTrainer.dynamic_capacity=8",
            ],
        ),
        timeout=180,
    )
    error = assert_one_error_line(
        result,
        2,
        "distinct keys that need a row to this shard, which holds 4 rows",
        "raise capacity to at least",
    )
    lines = result.stdout.splitlines()
    after = lines[lines.index(error) :]
    assert len(after) <= 20, result.stdout[-5000:]
    before = "\n".join(lines[: lines.index(error)])
    for repeated in ("assertion failed", "Additional GRPC error information", "Error received"):
        assert repeated not in before, result.stdout[-5000:]


def test_dynamic_tables_under_multi_worker_mirrored_are_refused_once_by_the_strategys_name(
    tmp_path,
):
    result = run(
        launch_cmd(
            ["--num_workers=2"],
            [
                f"--gin_file={DYNAMIC_TINY}",
                strategy_gin("multi_worker_mirrored"),
                f"--model_dir={tmp_path / 'model'}",
            ],
        ),
        timeout=180,
    )
    # Both workers refuse (unless the launcher stopped the second first): the console says it
    # once, and names the other task that said the same.
    assert_one_error_line(
        result,
        2,
        "a DynamicEmbedding runs under one_device or parameter_server only, "
        "not multi_worker_mirrored",
    )
    said = [line for line in result.stdout.splitlines() if "error: " in line]
    logs = [(tmp_path / "model" / "logs" / f"worker-{i}.log") for i in range(2)]
    both = all("not multi_worker_mirrored" in log.read_text(errors="replace") for log in logs)
    same = [line for line in result.stdout.splitlines() if "ended with the same error as" in line]
    assert len(said) == 1 and len(same) == (1 if both else 0), result.stdout[-3000:]


def test_an_unknown_eviction_policy_is_one_sentence_and_exit_2(tmp_path):
    result = run(
        train_cmd(
            f"--gin_file={DYNAMIC_TINY}",
            strategy_gin("one_device"),
            f"--model_dir={tmp_path / 'model'}",
            "--gin_bindings=ClickTrainer.eviction='fifo'",
        ),
        timeout=180,
    )
    assert_one_error_line(result, 2, "eviction must be one of 'lfu', 'lru', got 'fifo'")
