"""mirrored at run time: `MirroredStrategy` over all local GPUs, or N logical CPUs without one.

The TensorFlow half of `plan/strategies/mirrored.py`. The logical CPUs must exist before
TensorFlow's runtime starts, hence `prepare_devices`; the rest is `StrategyRuntime`'s
synchronous default.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.plan.strategies.mirrored import Mirrored
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime, available_gpus


class MirroredRuntime(StrategyRuntime):
    """mirrored in one task: one replica a device, gradients all-reduced within the process."""

    config: Mirrored

    @classmethod
    def prepare_devices(cls, config: Mirrored) -> None:
        """Without GPUs (and no devices named), splits the CPU into `num_logical_cpus` replicas."""
        if config.devices is None and not available_gpus():
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * config.num_logical_cpus
            )

    @classmethod
    def start(cls, config: Mirrored, *, context: TaskContext | None = None) -> MirroredRuntime:
        devices = config.devices
        if devices is None:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return cls(config, tf.distribute.MirroredStrategy(devices=devices), context=context)
