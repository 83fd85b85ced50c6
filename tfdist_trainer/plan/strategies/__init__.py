"""Gin-configurable distribution strategies: one `train.strategy = @NAME` line picks one.

The TF-free half of each strategy: one module a strategy, named as its gin name, over a
shared `base`, and `registry.NAMES`, the one list of them (see `registry` for what a
strategy is made of).
Building the `tf.distribute.Strategy`, placing a model and choosing the step is the other
half's job (`tfdist_trainer.runtime.strategies`), which the training task starts once TF
may start.

Importing this package registers every strategy's gin name; the names re-exported here are
those of the one module the strategies shared before, so users' imports keep working.
"""

from tfdist_trainer.plan.strategies.base import Action, StrategyConfig
from tfdist_trainer.plan.strategies.mirrored import Mirrored
from tfdist_trainer.plan.strategies.model_parallel import ModelParallel
from tfdist_trainer.plan.strategies.multi_worker_mirrored import MultiWorkerMirrored
from tfdist_trainer.plan.strategies.one_device import OneDevice
from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
from tfdist_trainer.plan.strategies.registry import (
    NAMES,
    as_strategy_config,
    config_class,
    help_text,
)

# A strategy added to NAMES alone (no import above) still registers its gin name here.
for _name in NAMES:
    config_class(_name)
del _name

__all__ = [
    "NAMES",
    "Action",
    "Mirrored",
    "ModelParallel",
    "MultiWorkerMirrored",
    "OneDevice",
    "ParameterServer",
    "StrategyConfig",
    "as_strategy_config",
    "config_class",
    "help_text",
]
