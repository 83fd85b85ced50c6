"""The step loops: many training steps per `tf.function` call, synchronous or scheduled.

One compiled loop function serves every strategy: it runs `steps` replica
steps through `strategy.run` and bumps the global step once. Synchronous
strategies call it directly; under parameter_server the chief hands whole
calls to `ClusterCoordinator.schedule`, so a worker runs `steps_per_loop`
steps per round trip (DESIGN: ~3x more steps/s at 10 than at 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf

from tfdist_trainer import data as data_lib
from tfdist_trainer.trainer import Trainer


@dataclasses.dataclass
class LoopResult:
    """What one `train(steps)` call reports."""

    steps: int
    loss: float                        # mean over the steps (NaN if any step was)
    first_nonfinite_step: int | None   # the global step whose loss first was NaN/Inf
    retried: bool = False              # set by NanGuard when it rolled back to a checkpoint


def _train_loop_fn(strategy: tf.distribute.Strategy, trainer: Trainer,
                   global_step: tf.Variable) -> Callable:
    @tf.function
    def train_loop(iterator, steps):
        base = global_step.read_value()
        total = tf.constant(0.0, tf.float32)
        first_bad = tf.constant(-1, tf.int64)
        for i in tf.range(steps):
            # The step being taken, for user steps that need it (schedules, fault injection).
            trainer.step = base + i + 1
            replica_loss = strategy.run(trainer.train_step, args=(next(iterator),))
            loss = tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, replica_loss, axis=None), tf.float32)
            total += loss
            first_bad = tf.where((first_bad < 0) & ~tf.math.is_finite(loss), base + i + 1, first_bad)
        # One increment per loop, at its end: a closure that a dead worker never finished
        # is re-run by the coordinator without counting its steps twice.
        global_step.assign_add(tf.cast(steps, tf.int64))
        return total / tf.cast(steps, tf.float32), first_bad
    return train_loop


def _combine(parts: list[tuple[int, float, int]]) -> LoopResult:
    steps = sum(n for n, _, _ in parts)
    loss = sum(n * l for n, l, _ in parts) / max(steps, 1)
    bad = [b for _, _, b in parts if b >= 0]
    return LoopResult(steps=steps, loss=loss, first_nonfinite_step=min(bad) if bad else None)


class TrainLoop:
    """Runs training steps under a synchronous strategy (one_device, mirrored, multi_worker_mirrored)."""

    def __init__(self, strategy: tf.distribute.Strategy, trainer: Trainer, global_step: tf.Variable,
                 steps_per_loop: int):
        self.strategy = strategy
        self.steps_per_loop = steps_per_loop
        self._loop = _train_loop_fn(strategy, trainer, global_step)
        dataset = strategy.distribute_datasets_from_function(
            tf.autograph.experimental.do_not_convert(
                lambda ctx: data_lib.finish(trainer.build_train_dataset(ctx))))
        self._iterator = iter(dataset)

    def train(self, steps: int) -> LoopResult:
        """Runs `steps` steps in calls of at most steps_per_loop."""
        parts, done = [], 0
        while done < steps:
            n = min(self.steps_per_loop, steps - done)
            loss, first_bad = self._loop(self._iterator, tf.constant(n, tf.int64))
            parts.append((n, float(loss), int(first_bad)))
            done += n
        return _combine(parts)


class ScheduledTrainLoop:
    """Runs training steps under parameter_server: whole loops scheduled onto workers by the chief."""

    def __init__(self, strategy: tf.distribute.Strategy, coordinator: Any, trainer: Trainer,
                 global_step: tf.Variable, steps_per_loop: int):
        self.coordinator = coordinator
        self.steps_per_loop = steps_per_loop
        self._loop = _train_loop_fn(strategy, trainer, global_step)

        @tf.autograph.experimental.do_not_convert
        def per_worker_dataset_fn():
            # Each worker is one input pipeline; asynchronous workers need no sharding.
            return strategy.distribute_datasets_from_function(
                tf.autograph.experimental.do_not_convert(
                    lambda ctx: data_lib.finish(trainer.build_train_dataset(ctx))))

        per_worker = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
        self._iterator = iter(per_worker)

    def train(self, steps: int) -> LoopResult:
        """Schedules ceil(steps / steps_per_loop) loops onto free workers and waits for all."""
        scheduled = []
        full, rest = divmod(steps, self.steps_per_loop)
        for n in [self.steps_per_loop] * full + ([rest] if rest else []):
            scheduled.append((n, self.coordinator.schedule(
                self._loop, args=(self._iterator, tf.constant(n, tf.int64)))))
        self.coordinator.join()
        parts = []
        for n, remote in scheduled:
            loss, first_bad = remote.fetch()
            parts.append((n, float(loss), int(first_bad)))
        return _combine(parts)


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

    def __init__(self, trainer: Trainer, strategy: tf.distribute.Strategy | None, distributed: bool):
        self.trainer = trainer
        self.strategy = strategy
        self.distributed = distributed
        dataset = trainer.build_eval_dataset(data_lib.single_pipeline_context())
        self.enabled = dataset is not None
        if not self.enabled:
            return
        dataset = data_lib.finish(dataset)
        if distributed:
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
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
