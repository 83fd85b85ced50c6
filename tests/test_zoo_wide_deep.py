"""The model zoo's wide_deep (configs/zoo/wide_deep.gin) trained under every strategy (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", zoo.STRATEGIES)
def test_wide_deep_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("wide_deep", strategy, str(tmp_path / strategy))
