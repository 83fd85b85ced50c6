"""Which runtime class runs a strategy: keyed on the plan's strategy names (`NAMES`).

Strategy `<name>`'s runtime is class `<Name>Runtime` in `runtime/strategies/<name>.py`, the
same name as its plan module (`plan/strategies/registry.py` says what a strategy is made of).
A config is looked up by its `name`, so a user's subclass of a strategy's config that keeps
the name runs with that strategy's runtime.
"""

from __future__ import annotations

import importlib

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.strategies import NAMES, StrategyConfig
from tfdist_trainer.plan.strategies.registry import class_name
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime


def runtime_class(name: str) -> type[StrategyRuntime]:
    """The runtime class of strategy `name` (importing its module, so only the one used loads)."""
    if name not in NAMES:
        raise ConfigError(f"strategy {name} has no runtime.")
    module = importlib.import_module(f"{__package__}.{name}")
    return getattr(module, f"{class_name(name)}Runtime")


def _runtime_of(config: StrategyConfig) -> type[StrategyRuntime]:
    if config.name not in NAMES:
        raise ConfigError(f"strategy {config.name or type(config).__name__} has no runtime.")
    return runtime_class(config.name)


def prepare_devices(config: StrategyConfig) -> None:
    """Device set-up that must happen before the TF runtime starts (logical CPUs...); most need none."""
    _runtime_of(config).prepare_devices(config)


def start(config: StrategyConfig, *, context: TaskContext | None = None) -> StrategyRuntime:
    """Builds the strategy of `config` (TF_CONFIG is already in the environment) and its runtime."""
    return _runtime_of(config).start(config, context=context)
