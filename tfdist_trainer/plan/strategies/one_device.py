"""one_device: one device in one process, the first GPU if there is one, else the CPU.

The plan half of the strategy (TF-free); `runtime/strategies/one_device.py` builds it. Every
default of `StrategyConfig` is this strategy's: one process, no peers, nothing served.
"""

from __future__ import annotations

import gin

from tfdist_trainer.plan.strategies.base import GIN_MODULE, StrategyConfig


@gin.configurable("one_device", module=GIN_MODULE)
class OneDevice(StrategyConfig):
    """One device in one process: the first GPU if there is one, else the CPU."""

    name = "one_device"

    def __init__(self, device: str | None = None):
        self.device = device
