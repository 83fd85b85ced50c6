"""The MNIST recipe with configs/mnist_best_export.gin, then configs/mnist_warm_start.gin.

A short pretraining run exports its best models by eval accuracy; a fine-tuning
run warm-starts its convolution layers from it, as the two config files
describe. Real `tfdist-train` processes, the offline digits set.
"""

from __future__ import annotations

import json
import os

import clusterlib
import numpy as np
import tensorflow as tf
from clusterlib import FAST_MNIST, REPO, strategy_gin, train_cmd
from servinglib import assert_each_weight_exported_once, model_weight_bytes

TIMEOUT_S = 240


def tfdist_train(*args: str) -> str:
    result = clusterlib.run(train_cmd(*args), timeout=TIMEOUT_S)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout[-6000:]}"
    return result.stdout


def test_mnist_best_export_then_warm_start(tmp_path):
    pretrain, finetune = tmp_path / "pretrain", tmp_path / "finetune"
    tfdist_train(
        *FAST_MNIST,
        f"--gin_file={REPO}/configs/mnist_best_export.gin",
        strategy_gin("one_device"),
        "--gin_bindings=train.train_steps=150",
        "--gin_bindings=train.eval_every_n_steps=50",
        f"--model_dir={pretrain}",
    )
    export_dir = pretrain / "export" / "best_eval_accuracy"
    steps = sorted(int(name) for name in os.listdir(export_dir))
    assert 1 <= len(steps) <= 2, steps  # BestExporter.keep = 2
    evals = {r["step"]: r for r in clusterlib.read_records(str(pretrain)) if r["kind"] == "eval"}
    assert sorted(evals) == [50, 100, 150], evals
    with open(export_dir / str(steps[-1]) / "best_export.json") as f:
        record = json.load(f)
    assert record["metric"] == "eval_accuracy" and record["mode"] == "max"
    assert record["value"] == max(r["eval_accuracy"] for r in evals.values())
    # kept: serve needs its variables
    loaded = tf.saved_model.load(str(export_dir / str(steps[-1])))
    served = loaded.serve(tf.zeros([3, 28, 28, 1], tf.float32))
    assert served.shape == (3, 10)
    assert_each_weight_exported_once(
        str(export_dir / str(steps[-1])), model_weight_bytes(record["checkpoint"])
    )

    out = tfdist_train(
        *FAST_MNIST,
        f"--gin_file={REPO}/configs/mnist_warm_start.gin",
        strategy_gin("one_device"),
        "--gin_bindings=train.train_steps=20",
        f"--gin_bindings=WarmStart.checkpoint='{pretrain}'",
        f"--model_dir={finetune}",
    )
    with open(finetune / "warm_start.json") as f:
        report = json.load(f)
    assert report["checkpoint"] == f"{pretrain}/ckpt-150"
    assert report["warm_started"] == [
        "conv2d/kernel",
        "conv2d/bias",
        "conv2d_1/kernel",
        "conv2d_1/bias",
    ]
    assert report["fresh"] == ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
    assert "4 of 8 variables warm-started" in out
    assert np.isfinite([r["loss"] for r in clusterlib.train_records(str(finetune))]).all()
