"""The model zoo's keras_hub_bert (configs/zoo/keras_hub_bert.gin: keras-hub, built from config) under model_parallel and parameter_server (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
# GPT-2 (tests/test_zoo_keras_hub_gpt2.py) meets all five strategies; BERT the two that differ
# most from one another (a backbone split over devices, variables on a ps), which keeps the
# suite's time in bounds (each run is 70-90 s on the CI machine under load).
@pytest.mark.parametrize("strategy", ["model_parallel", "parameter_server"])
def test_keras_hub_bert_trains_under_the_splitting_strategies(strategy, tmp_path):
    zoo.train_and_check("keras_hub_bert", strategy, str(tmp_path / strategy))
