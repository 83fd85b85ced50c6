"""The model zoo's resnet_cnn (configs/zoo/resnet_cnn.gin) trained under the strategies of zoo.RUNS (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
# parameter_server at steps_per_loop 'auto': keras_hub_bert (tests/zoo.py, RUNS).
@pytest.mark.parametrize("strategy", zoo.strategies("resnet_cnn"))
def test_resnet_cnn_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("resnet_cnn", strategy, str(tmp_path / strategy))
