"""`plan/strategies/registry.NAMES` is the one list of strategies, and the files agree with it.

A strategy is `plan/strategies/<name>.py` (class `<Name>`, gin name `<name>`),
`runtime/strategies/<name>.py` or the package `runtime/strategies/<name>/` (class
`<Name>Runtime`) and `configs/strategies/<name>.gin`.
Everything that lists the strategies reads NAMES, so a strategy missing a file, or a file
whose strategy is not in NAMES, would go unseen by the tests that run every strategy:
both directions are checked here (issue 38).
"""

from __future__ import annotations

import os
import pkgutil

import pytest
from clusterlib import REPO

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan import gin_config, strategies
from tfdist_trainer.plan.strategies import registry
from tfdist_trainer.runtime import strategies as runtime_strategies

#: The modules of both packages that are no strategy of their own.
SHARED = {"base", "registry"}
PACKAGE_GIN_DIR = os.path.join(gin_config.PACKAGE_CONFIGS_DIR, "strategies")


def _strategy_modules(package) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(package.__path__)} - SHARED


def test_every_strategy_module_and_gin_file_is_a_name_in_the_registry():
    names = set(registry.NAMES)
    assert len(names) == len(registry.NAMES), registry.NAMES
    assert _strategy_modules(strategies) == names
    assert _strategy_modules(runtime_strategies) == names
    gin_files = {f.removesuffix(".gin") for f in os.listdir(PACKAGE_GIN_DIR) if f.endswith(".gin")}
    assert gin_files == names
    # the repository's configs/strategies is the package's (a link): the same files
    assert os.path.samefile(os.path.join(REPO, "configs", "strategies"), PACKAGE_GIN_DIR)


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_name_has_its_plan_and_runtime_modules(name):
    config_cls = registry.config_class(name)
    assert issubclass(config_cls, strategies.StrategyConfig)
    assert config_cls.__module__ == f"tfdist_trainer.plan.strategies.{name}"
    assert config_cls.name == name
    runtime_cls = runtime_strategies.runtime_class(name)
    assert issubclass(runtime_cls, runtime_strategies.StrategyRuntime)
    assert runtime_cls.__module__ == f"tfdist_trainer.runtime.strategies.{name}"
    # its own start, or one it inherits from another strategy's runtime: not the base's
    assert runtime_cls.start.__func__ is not runtime_strategies.StrategyRuntime.start.__func__, (
        f"{runtime_cls.__name__} must say how it starts"
    )


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_gin_file_picks_its_strategy_by_name(name):
    """strategies/<name>.gin (found through the package, as a user names it) binds @<name>,
    and the fully qualified gin name of the single module the strategies once shared still
    resolves."""
    mnist = os.path.join(REPO, "configs", "mnist.gin")
    experiment = gin_config.load_experiment([mnist, f"strategies/{name}.gin"], [])
    assert type(experiment.strategy_config) is registry.config_class(name)
    qualified = f"train.strategy = @tfdist_trainer.plan.strategies.{name}"
    experiment = gin_config.load_experiment([mnist], [qualified])
    assert type(experiment.strategy_config) is registry.config_class(name)


def test_an_unknown_name_is_one_sentence_naming_the_strategies():
    with pytest.raises(ConfigError, match="the strategies are one_device, mirrored"):
        registry.config_class("fsdp")
    with pytest.raises(ConfigError, match="strategy fsdp has no runtime"):
        runtime_strategies.runtime_class("fsdp")
    assert ", ".join(registry.NAMES) in " ".join(registry.help_text().split())
