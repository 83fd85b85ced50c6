"""The one list of strategies (`NAMES`), and where each strategy's two halves live.

A strategy is a pair of same-named modules and a gin file, found by its name:

    plan/strategies/<name>.py          class <Name>(StrategyConfig), gin name <name> (TF-free)
    runtime/strategies/<name>.py       class <Name>Runtime(StrategyRuntime) (TensorFlow)
    configs/strategies/<name>.gin      train.strategy = @<name> and its knobs

(`<Name>` is `<name>` in CamelCase: multi_worker_mirrored -> MultiWorkerMirrored.) The
runtime's registry (`runtime/strategies/registry.py`) looks a strategy's runtime up by its
name in `NAMES`.
"""

from __future__ import annotations

import importlib
import textwrap
from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.strategies.base import StrategyConfig

#: Every strategy, in the order the docs and the tests list them.
NAMES: tuple[str, ...] = (
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "model_parallel",
)


def class_name(name: str) -> str:
    """The class of strategy `name` in its plan module (`multi_worker_mirrored` ->
    `MultiWorkerMirrored`); its runtime class adds `Runtime`."""
    return "".join(part.capitalize() for part in name.split("_"))


def config_class(name: str) -> type[StrategyConfig]:
    """The gin-configurable class of strategy `name` (importing its plan module registers it)."""
    if name not in NAMES:
        raise ConfigError(f"there is no strategy {name!r}; the strategies are {', '.join(NAMES)}.")
    module = importlib.import_module(f"{__package__}.{name}")
    return getattr(module, class_name(name))


def help_text(width: int = 92) -> str:
    """How `--help` says a strategy is picked, naming every strategy (`tfdist-train`, `tfdist-launch`)."""
    return textwrap.fill(
        f"The strategy is one gin file, strategies/<name>.gin, where <name> is one of "
        f"{', '.join(NAMES)}.",
        width,
    )


def as_strategy_config(value: Any) -> StrategyConfig:
    """Accepts `@one_device` or `@one_device()` from gin, or a StrategyConfig instance."""
    if isinstance(value, StrategyConfig):
        return value
    if callable(value):
        made = value()
        if isinstance(made, StrategyConfig):
            return made
    raise ConfigError(
        f"train.strategy must be one of {', '.join('@' + name for name in NAMES)}; got {value!r}."
    )
