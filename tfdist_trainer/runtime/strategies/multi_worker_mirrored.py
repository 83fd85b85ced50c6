"""multi_worker_mirrored at run time: `MultiWorkerMirroredStrategy`, all-reduce over worker processes.

The TensorFlow half of `plan/strategies/multi_worker_mirrored.py`. Its workers run in
lock-step, which `StrategyRuntime`'s defaults already handle (`max_over_workers` has peers
here); what is its own is the collective's settings, which model_parallel's data_parallel
mode uses too (`communication_options`).
"""

from __future__ import annotations

import tensorflow as tf

from tfdist_trainer.plan.strategies.multi_worker_mirrored import MultiWorkerMirrored
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime


def communication_options(
    config: MultiWorkerMirrored,
) -> tf.distribute.experimental.CommunicationOptions:
    """The all-reduce implementation and timeout, from multi_worker_mirrored.* in gin."""
    implementation = getattr(
        tf.distribute.experimental.CommunicationImplementation, config.communication.upper()
    )
    return tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=config.collective_timeout_s
    )


class MultiWorkerMirroredRuntime(StrategyRuntime):
    """multi_worker_mirrored in one worker: its replicas, in lock-step with every other worker's."""

    config: MultiWorkerMirrored

    @classmethod
    def start(
        cls, config: MultiWorkerMirrored, *, context: TaskContext | None = None
    ) -> MultiWorkerMirroredRuntime:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options(config)
        )
        return cls(config, strategy, context=context)
