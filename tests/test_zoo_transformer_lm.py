"""The model zoo's transformer_lm (configs/zoo/transformer_lm.gin) trained under every strategy (see tests/zoo.py)."""

from __future__ import annotations

import pytest
import zoo


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", zoo.STRATEGIES)
def test_transformer_lm_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("transformer_lm", strategy, str(tmp_path / strategy))
