"""one_device at run time: `OneDeviceStrategy` on the first GPU, else the CPU (or `one_device.device`).

The TensorFlow half of `plan/strategies/one_device.py`. Every default of `StrategyRuntime`
is this strategy's except the evaluation pass: it says which device, and evaluates there.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.plan.strategies.one_device import OneDevice
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import loops
from tfdist_trainer.runtime.strategies.base import StrategyRuntime, available_gpus


class OneDeviceRuntime(StrategyRuntime):
    """one_device in one task: one replica on one device."""

    config: OneDevice

    @classmethod
    def start(cls, config: OneDevice, *, context: TaskContext | None = None) -> OneDeviceRuntime:
        device = config.device or ("/gpu:0" if available_gpus() else "/cpu:0")
        return cls(config, tf.distribute.OneDeviceStrategy(device), context=context)

    def eval_loop(self, trainer: Any) -> loops.EvalLoop:
        """One replica: a plain loop on its device is the same pass without the distributed
        iterator's per-batch cost (about 4x faster per pass, measured on MNIST digits)."""
        device = self.strategy.extended.worker_devices[0]
        return loops.EvalLoop(trainer, self.strategy, distributed=False, device=device)
