"""The model zoo's transformer_lm (configs/zoo/transformer_lm.gin) trained under the strategies of zoo.RUNS (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
# one_device at steps_per_loop 10 (issue 20's crash) and parameter_server through the tf.data
# service; its other strategies' (strategy, steps_per_loop) cells are held by keras_hub_gpt2, the
# model of the same row of the Latin square (tests/zoo.py, RUNS).
@pytest.mark.parametrize("strategy", zoo.strategies("transformer_lm"))
def test_transformer_lm_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("transformer_lm", strategy, str(tmp_path / strategy))


def test_the_zoo_meets_every_strategy_at_every_steps_per_loop():
    """zoo.RUNS still covers the Latin square: every strategy trains a real-shape model at
    steps_per_loop 1, 10 and 'auto'; keras-hub's models run under both splitting strategies; the
    cells that crashed or carry a special setting stay."""
    met = {s: set() for s in zoo.STRATEGIES}
    for model, strategies in zoo.RUNS.items():
        assert model in zoo.MODELS and set(strategies) <= set(zoo.STRATEGIES), model
        for strategy in strategies:
            met[strategy].add(zoo.steps_per_loop(model, strategy))
    assert met == {s: set(zoo.STEPS_PER_LOOP) for s in zoo.STRATEGIES}, met
    for model in ("keras_hub_gpt2", "keras_hub_bert"):
        assert {"parameter_server", "model_parallel"} <= set(zoo.RUNS[model]), model
    assert set(zoo.RUNS["keras_hub_gpt2"]) | {"one_device"} == set(zoo.STRATEGIES)
    for model, strategy in (
        ("transformer_lm", "one_device"),
        zoo.MIXED_BFLOAT16,
        zoo.DATA_SERVICE,
        ("resnet_cnn", "model_parallel"),
        ("wide_deep", "model_parallel"),
    ):
        assert strategy in zoo.RUNS[model], (model, strategy)
    assert zoo.steps_per_loop("transformer_lm", "one_device") == "10"
