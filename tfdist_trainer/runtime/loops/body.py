"""The one step-loop body every strategy runs: many training steps per `tf.function` call.

It runs `steps` replica steps through `strategy.run` and bumps the global step
once. Synchronous strategies call it directly (`synchronous.TrainLoop`); under
parameter_server the chief hands whole calls to `ClusterCoordinator.schedule`
(`runtime/strategies/parameter_server/scheduled_loop.py`), so a worker runs
`steps_per_loop` steps per round trip (1.5-2x more steps/s at 10 than at 1 on 2 CPUs).
Reading through the tf.data service, the same body stops early when a finite dataset ends.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfdist_trainer.hooks.run import LoopResult
from tfdist_trainer.trainers import data as data_lib
from tfdist_trainer.trainers.trainer import Trainer


def _earliest_step(strategy: tf.distribute.Strategy, per_replica_step) -> tf.Tensor:
    """The smallest non-negative step over all replicas, or -1 (ReduceOp has no MIN: gather, then min)."""
    if strategy.num_replicas_in_sync == 1:
        return strategy.experimental_local_results(per_replica_step)[0]
    steps = strategy.gather(
        strategy.run(lambda s: tf.reshape(s, [1]), args=(per_replica_step,)), axis=0
    )
    never = tf.int64.max
    earliest = tf.reduce_min(tf.where(steps < 0, tf.constant(never, tf.int64), steps))
    return tf.where(earliest == never, tf.constant(-1, tf.int64), earliest)


def train_loop_fn(
    strategy: tf.distribute.Strategy,
    trainer: Trainer,
    global_step: tf.Variable,
    jit_compile: bool = False,
    step_fn: Callable | None = None,
    next_batch: Callable = next,
    until_data_ends: bool = False,
    batches_per_step: int = 1,
) -> Callable:
    """The compiled loop; `next_batch(iterator)` gives one step's input (a `data.SyncInput`'s, or `next`).

    With `until_data_ends` the loop stops early when the iterator has no more
    data, and also returns the steps it took (a finite dataset read through the
    tf.data service ends the run when its epoch is consumed) and the index of
    the parameter_server worker that ran it. Both share the replica step and the
    end of the loop (`finish`); only the loop statement differs.
    """
    step_fn = step_fn or trainer.train_step

    def step_input(iterator):
        # One step's input: a batch, or the k batches one accumulated update takes (loops.accumulate).
        if batches_per_step == 1:
            return next_batch(iterator)
        return tuple(next_batch(iterator) for _ in range(batches_per_step))

    # each replica's step is compiled (as Keras does for fit); the loop around it is not
    if jit_compile:
        step_fn = tf.function(step_fn, jit_compile=True)

    def replica_step(batch, total, first_bad, step):
        # Per replica, no communication: the loss sum and the first non-finite step stay local
        # until the loop ends (one cross-replica reduction per call, not one per step).
        loss = tf.cast(step_fn(batch), tf.float32)
        first_bad = tf.where((first_bad < 0) & ~tf.math.is_finite(loss), step, first_bad)
        return total + loss, first_bad

    def replica_start():
        return tf.constant(0.0, tf.float32), tf.constant(-1, tf.int64)

    def finish(total, first_bad, done):
        # One increment per loop, at its end: a closure that a dead worker never finished
        # is re-run by the coordinator without counting its steps twice.
        global_step.assign_add(done)
        # Replica losses are already scaled to the global batch: their sum is the global loss.
        total = tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None), tf.float32)
        mean = total / tf.cast(tf.maximum(done, 1), tf.float32)
        return mean, _earliest_step(strategy, first_bad)

    @tf.function
    def train_loop(iterator, steps):
        total, first_bad = strategy.run(replica_start)
        # AutoGraph carries `trainer.step` through the loop: it must start in this graph.
        trainer.step = global_step.read_value()
        for _ in tf.range(steps):
            # The step being taken, for user steps that need it (schedules, fault injection).
            # A loop-carried counter, never `base + i + 1`: ArithmeticOptimizer folds that into
            # a 3-input AddN whose first input (`base`) is a loop invariant, and MemoryOptimizer
            # (once a graph's estimated memory is large) rewrites such an AddN into a
            # TemporaryVariable gated only by that input. The loop's last, dead iteration (the
            # one whose condition is false) then creates the variable and never destroys it, so
            # the next call fails with ALREADY_EXISTS '.../tmp_var/frame:.../iter:N' (issue 20).
            trainer.step = trainer.step + 1
            total, first_bad = strategy.run(
                replica_step, args=(step_input(iterator), total, first_bad, trainer.step)
            )
        return finish(total, first_bad, steps)

    @tf.function
    def train_loop_until_data_ends(iterator, steps):
        # The same loop, stopping at the end of the data (a Python `break` AutoGraph turns into
        # the while loop's condition: kept out of the loop above, which never ends early).
        total, first_bad = strategy.run(replica_start)
        trainer.step = global_step.read_value()
        done = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            trainer.step = trainer.step + 1  # loop-carried, as above
            total, first_bad = strategy.run(
                replica_step, args=(batch.get_value(), total, first_bad, trainer.step)
            )
            done += 1
        worker = tf.cast(
            tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64
        )
        return (*finish(total, first_bad, done), done, worker)

    return train_loop_until_data_ends if until_data_ends else train_loop


def never() -> bool:
    """A loop's default `stop`: nothing asks it to end early."""
    return False


def combine(parts: list[tuple[int, float, int]], data_ended: bool = False) -> LoopResult:
    steps = sum(n for n, _, _ in parts)
    loss = sum(n * part_loss for n, part_loss, _ in parts) / max(steps, 1)
    bad = [b for _, _, b in parts if b >= 0]
    return LoopResult(
        steps=steps,
        loss=loss,
        first_nonfinite_step=min(bad) if bad else None,
        data_ended=data_ended,
    )


def train_dataset_fn(
    trainer: Trainer, context: tf.distribute.InputContext | None = None
) -> Callable:
    """The function from an InputContext to the Trainer's finished training pipeline.

    `context`, when given, replaces the one TF passes (parameter_server: TF's
    says "pipeline 0 of 1" on every worker). AutoGraph must not convert the
    user's pipeline code: it is plain Python that builds a tf.data graph.
    """

    @tf.autograph.experimental.do_not_convert
    def dataset_fn(tf_context):
        return data_lib.finish(trainer.build_train_dataset(context or tf_context))

    return dataset_fn
