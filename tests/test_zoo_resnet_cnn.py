"""The model zoo's resnet_cnn (configs/zoo/resnet_cnn.gin) trained under every strategy (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", zoo.STRATEGIES)
def test_resnet_cnn_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("resnet_cnn", strategy, str(tmp_path / strategy))
