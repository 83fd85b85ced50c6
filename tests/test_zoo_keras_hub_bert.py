"""The model zoo's keras_hub_bert (configs/zoo/keras_hub_bert.gin: keras-hub, built from config) under every strategy (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", zoo.STRATEGIES)
def test_keras_hub_bert_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("keras_hub_bert", strategy, str(tmp_path / strategy))
