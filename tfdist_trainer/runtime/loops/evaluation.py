"""One evaluation pass over the Trainer's eval data, under any strategy or none."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfdist_trainer.trainers import data as data_lib
from tfdist_trainer.trainers.trainer import Trainer


def _eval_loop_fn(trainer: Trainer) -> Callable:
    @tf.function(reduce_retracing=True)
    def eval_batch(batch):
        trainer.eval_step(batch)

    return eval_batch


class EvalLoop:
    """One pass over the evaluation data; returns {metric name: value}.

    Synchronous strategies split batches over replicas (partial final batches
    are handled by tf.distribute). Under parameter_server, and in the
    evaluator side-car, the pass runs locally on the calling process, reading
    variables from wherever they live.
    """

    def __init__(
        self,
        trainer: Trainer,
        strategy: tf.distribute.Strategy | None,
        distributed: bool,
        *,
        device: str | None = None,
    ):
        """`distributed`: split batches over the strategy's replicas; else a local pass, on
        `device` when given (which pass a strategy runs is `StrategyRuntime.eval_loop`)."""
        self.trainer = trainer
        self.strategy = strategy
        self.distributed = distributed and device is None
        self.device = device  # set when the pass runs on one replica's device directly
        dataset = trainer.build_eval_dataset(data_lib.single_pipeline_context())
        self.enabled = dataset is not None
        if not self.enabled:
            return
        dataset = data_lib.finish(dataset)
        distributed = self.distributed
        if distributed:
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.DATA
            )
            self._dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))

            @tf.function(reduce_retracing=True)
            def eval_batch(batch):
                strategy.run(trainer.eval_step, args=(batch,))
        else:
            self._dataset = dataset
            eval_batch = _eval_loop_fn(trainer)

        def eval_pass(batches):
            # A plain Python loop over a compiled step: it ends with the data whatever AutoGraph
            # makes of the step, and tf.distribute evens out partial final batches across workers.
            for batch in batches:
                eval_batch(batch)

        self._pass = eval_pass

    def evaluate(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        for metric in self.trainer.eval_metrics:
            metric.reset_state()
        if self.device:
            with tf.device(self.device):
                self._pass(self._dataset)
        else:
            self._pass(self._dataset)
        return metric_values(self.trainer.eval_metrics)


def metric_values(metrics) -> dict[str, float]:
    values = {}
    for metric in metrics:
        result = metric.result()
        if isinstance(result, dict):
            values.update({k: float(v) for k, v in result.items()})
        else:
            values[metric.name] = float(result)
    return values
