"""mirrored: synchronous replicas in one process (all local GPUs, or N logical CPUs).

The plan half of the strategy (TF-free); `runtime/strategies/mirrored.py` builds it. Its
topology is the one-process default of `StrategyConfig`; only its settings are its own.
"""

from __future__ import annotations

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.strategies.base import GIN_MODULE, StrategyConfig


@gin.configurable("mirrored", module=GIN_MODULE)
class Mirrored(StrategyConfig):
    """Synchronous replicas in one process: all local GPUs, or N logical CPUs without a GPU."""

    name = "mirrored"

    def __init__(self, devices: list[str] | None = None, num_logical_cpus: int = 2):
        if not checks.is_positive_int(num_logical_cpus):
            raise ConfigError(f"mirrored.num_logical_cpus must be >= 1, got {num_logical_cpus!r}.")
        self.devices = devices
        self.num_logical_cpus = num_logical_cpus
