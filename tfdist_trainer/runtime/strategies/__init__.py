"""A strategy at run time: the TensorFlow half of each gin strategy (`plan/strategies` is the TF-free half).

One module a strategy, named as its plan module, holding its `<Name>Runtime`, over a shared
`base` (`StrategyRuntime`) and a `registry` keyed on the plan's `NAMES`. A training task
uses it in two steps, because devices must be configured before TensorFlow's runtime
starts and the strategy only after:

    strategies.prepare_devices(config)           # logical CPUs, GPU memory growth...
    runtime = strategies.start(config, context=context)
    runtime.strategy, runtime.coordinator        # the tf.distribute objects
    model = runtime.prepare_model(model)         # model_parallel places its layers here
    loop = runtime.make_train_loop(...)          # the step loop this strategy runs
"""

from tfdist_trainer.runtime.strategies.base import StrategyRuntime
from tfdist_trainer.runtime.strategies.registry import prepare_devices, runtime_class, start

__all__ = ["StrategyRuntime", "prepare_devices", "runtime_class", "start"]
