"""recipes/keras_mnist: a compiled Keras model, no Trainer subclass, under four strategies.

The same gin file (configs/keras_mnist.gin, which names the recipe's model and
data functions for KerasTrainer) and the same launcher flags train under
one_device, mirrored and multi_worker_mirrored in one test, and under
parameter_server with an evaluator side-car in the other; only the strategy gin
file changes. Small model, few steps, the offline digits set.
"""

from __future__ import annotations

import os

import clusterlib
import pytest
from clusterlib import REPO, launch_cmd, read_records, strategy_gin

STEPS = 60
SMALL = [
    f"--gin_file={REPO}/configs/keras_mnist.gin",
    f"--gin_bindings=train.train_steps={STEPS}",
    "--gin_bindings=train.log_every_n_steps=20",
    f"--gin_bindings=train.eval_every_n_steps={STEPS}",
    "--gin_bindings=mnist_model.filters=(4, 8)",
    "--gin_bindings=mnist_model.dense_units=16",
    "--gin_bindings=mnist_model.learning_rate=0.003",
    "--gin_bindings=mnist_split.data_source='digits'",
]


@pytest.mark.cluster
def test_the_compiled_model_recipe_trains_under_three_strategies_changing_only_the_strategy_gin(
    tmp_path,
):
    # parameter_server: the side-car test below (same flags, plus an evaluator).
    for strategy in ("one_device", "mirrored", "multi_worker_mirrored"):
        model_dir = str(tmp_path / strategy)
        result = clusterlib.run(
            launch_cmd(
                ["--num_workers=2", "--num_ps=1"],
                [*SMALL, strategy_gin(strategy), f"--model_dir={model_dir}"],
            ),
            timeout=240,
        )
        assert result.returncode == 0, f"{strategy}:\n{result.stdout[-6000:]}"
        assert f"under {strategy}" in result.stdout
        records = read_records(model_dir)
        train = [r for r in records if r["kind"] == "train"]
        evals = [r for r in records if r["kind"] == "eval"]
        assert train[-1]["step"] == STEPS and train[0]["loss"] > train[-1]["loss"], (
            strategy,
            train,
        )
        # The compiled metrics ("accuracy" resolved against sparse labels), train and eval.
        assert "accuracy" in train[-1], train[-1]
        assert evals and evals[-1]["step"] == STEPS, records
        assert evals[-1]["eval_accuracy"] > 0.3, (strategy, evals[-1])  # chance is 0.1
        with open(os.path.join(model_dir, "checkpoint")) as f:
            assert f'model_checkpoint_path: "ckpt-{STEPS}"' in f.read()
        assert clusterlib.no_process_left(model_dir) == []


@pytest.mark.cluster
def test_the_evaluator_side_car_evaluates_the_compiled_model_of_each_checkpoint(tmp_path):
    """train_and_evaluate's shape: chief, workers, ps and an evaluator task following the checkpoints."""
    model_dir = str(tmp_path / "run")
    result = clusterlib.run(
        launch_cmd(
            ["--num_workers=2", "--num_ps=1", "--evaluator"],
            [
                *SMALL,
                "--gin_bindings=train.checkpoint_every_n_steps=30",
                strategy_gin("parameter_server"),
                f"--model_dir={model_dir}",
            ],
        ),
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert "under parameter_server" in result.stdout
    train = [r for r in read_records(model_dir) if r["kind"] == "train"]
    assert train[-1]["step"] == STEPS and train[0]["loss"] > train[-1]["loss"], train
    assert "accuracy" in train[-1], train[-1]
    evals = read_records(model_dir, os.path.join("eval", "metrics.jsonl"))
    assert [r["step"] for r in evals][-1] == STEPS, evals
    assert {"eval_loss", "eval_accuracy"} <= set(evals[-1])
    assert evals[-1]["eval_accuracy"] > 0.3, evals[-1]
