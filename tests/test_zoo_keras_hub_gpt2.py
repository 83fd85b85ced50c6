"""The model zoo's keras_hub_gpt2 (configs/zoo/keras_hub_gpt2.gin: keras-hub, built from config) under every strategy but one_device (see tests/zoo.py)."""

from __future__ import annotations

import os

import pytest
import zoo
from servinglib import assert_each_weight_exported_once, model_weight_bytes


@pytest.mark.cluster
# parameter_server: test_keras_hub_gpt2_takes_the_everyday_knobs below (the same model, strategy
# and steps_per_loop, with knobs added); one_device at steps_per_loop 10: transformer_lm
# (tests/zoo.py, RUNS).
@pytest.mark.parametrize("strategy", zoo.strategies("keras_hub_gpt2", but=["parameter_server"]))
def test_keras_hub_gpt2_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("keras_hub_gpt2", strategy, str(tmp_path / strategy))


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", ["parameter_server"])
def test_keras_hub_gpt2_takes_the_everyday_knobs(strategy, tmp_path):
    """Gradient accumulation, EMA weights (evaluated and exported) and global-norm clipping
    together, on a model nobody here wrote, through the real-shape loop."""
    zoo.train_and_check(
        "keras_hub_gpt2",
        strategy,
        str(tmp_path / strategy),
        extra=[
            "train.gradient_accumulation_steps=2",
            "GPT2LMTrainer.use_ema=True",
            "GPT2LMTrainer.global_clipnorm=1.0",
            "train.extra_hooks=[@ExportSavedModel()]",
        ],
    )
    model_dir = tmp_path / strategy
    export_dir = model_dir / "export" / str(zoo.TRAIN_STEPS)
    assert (export_dir / "saved_model.pb").exists()
    # Each weight once, the tied embedding and head included.
    assert_each_weight_exported_once(
        str(export_dir), model_weight_bytes(os.path.join(model_dir, f"ckpt-{zoo.TRAIN_STEPS}"))
    )
