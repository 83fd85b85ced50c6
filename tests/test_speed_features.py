"""Speed knobs: steps_per_loop='auto', XLA, mixed precision, and a loop that never retraces."""

from __future__ import annotations

import re

import pytest
from clusterlib import FAST_MNIST, read_records, run, strategy_gin, train_cmd

# -- the knobs end to end -------------------------------------------------------


def _train(tmp_path, *bindings, strategy="one_device", steps=200):
    model_dir = str(tmp_path / "model")
    result = run(
        train_cmd(
            *FAST_MNIST,
            strategy_gin(strategy),
            f"--model_dir={model_dir}",
            f"--gin_bindings=train.train_steps={steps}",
            *[f"--gin_bindings={b}" for b in bindings],
        ),
        timeout=300,
    )
    return result, model_dir


@pytest.mark.cluster
def test_auto_steps_per_loop_settles_and_trains(tmp_path):
    # On a busy host noise can look like a gain at every doubling; the search is bounded by the
    # run (settled within half of it), so it must report a size whatever the timings.
    result, model_dir = _train(
        tmp_path,
        "train.steps_per_loop='auto'",
        "train.log_every_n_steps=600",
        "train.checkpoint_every_n_steps=None",
        steps=600,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    settled = re.findall(r"steps_per_loop='auto' settled on (\d+)", result.stdout)
    assert settled, result.stdout[-3000:]
    assert 8 <= int(settled[0]) <= 64  # 600 steps: up to 64 (8*3 + 2*(16 + 32 + 64) = 248)
    assert read_records(model_dir)[-1]["step"] == 600


@pytest.mark.cluster
@pytest.mark.parametrize(
    "binding, steps, min_accuracy",
    [
        ("train.jit_compile=True", 200, 0.8),
        ("train.mixed_precision='mixed_bfloat16'", 200, 0.8),
        # CPUs emulate float16 slowly: fewer steps, the point is that loss scaling keeps it learning.
        ("train.mixed_precision='mixed_float16'", 100, 0.5),
    ],
)
def test_speed_knob_trains(tmp_path, binding, steps, min_accuracy):
    result, model_dir = _train(tmp_path, binding, "train.log_every_n_steps=50", steps=steps)
    assert result.returncode == 0, result.stdout[-3000:]
    records = read_records(model_dir)
    train = [r for r in records if r["kind"] == "train"]
    assert train[-1]["step"] == steps and train[-1]["loss"] < train[0]["loss"]
    assert [r for r in records if r["kind"] == "eval"][-1]["eval_accuracy"] > min_accuracy


def test_bad_mixed_precision_is_one_sentence(tmp_path):
    result, _ = _train(tmp_path, "train.mixed_precision='float8'")
    assert result.returncode == 2
    assert (
        "train.mixed_precision must be None, 'mixed_bfloat16' or 'mixed_float16'" in result.stdout
    )


@pytest.mark.parametrize("strategy", ["mirrored", "model_parallel"])
def test_jit_compile_across_devices_of_one_process_is_refused_clearly(tmp_path, strategy):
    result, _ = _train(tmp_path, "train.jit_compile=True", strategy=strategy)
    assert result.returncode != 0
    assert (
        f"train.jit_compile=True cannot run {strategy} over several devices of one process"
        in result.stdout
    )
