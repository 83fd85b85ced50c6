"""The loop of parameter_server: the chief schedules whole step loops onto the workers."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer.runtime.loops.body import (
    LoopResult,
    combine,
    never,
    train_dataset_fn,
    train_loop_fn,
)
from tfdist_trainer.runtime.loops.size import StepsPerLoopTuner, as_loop_size
from tfdist_trainer.runtime.strategies.parameter_server import data_service, watchdog
from tfdist_trainer.trainers import data as data_lib
from tfdist_trainer.trainers.trainer import Trainer

#: Rounds in a row without a single step that end a served epoch even if a worker never said so.
EMPTY_ROUNDS_AT_END = 3


class ScheduledTrainLoop:
    """Runs training steps under parameter_server: whole loops scheduled onto workers by the chief.

    Each worker reads its own pipeline; which iterator feeds it is
    `data.uses_distributed_iterator`'s rule, the same as for the synchronous
    strategies (a plain one unless a worker has several accelerator replicas).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        coordinator: Any,
        trainer: Trainer,
        global_step: tf.Variable,
        steps_per_loop: int | StepsPerLoopTuner,
        *,
        jit_compile: bool = False,
        step_fn: Callable | None = None,
        batches_per_step: int = 1,
        num_workers: int = 1,
        stall_timeout_s: float = 0.0,
        worker_addresses: Sequence[str] = (),
        dispatcher_address: str | None = None,
    ):
        """`dispatcher_address`: read the data through the tf.data service (`data_service`)."""
        self.coordinator = coordinator
        self.num_workers = max(1, num_workers)
        self.size = as_loop_size(steps_per_loop)
        self.stall_timeout_s = stall_timeout_s
        self.worker_addresses = list(worker_addresses)
        self.served = dispatcher_address is not None
        self._workers_out_of_data: set[int] = set()
        self._empty_rounds = 0
        self._loop = train_loop_fn(
            strategy,
            trainer,
            global_step,
            jit_compile,
            step_fn,
            until_data_ends=self.served,
            batches_per_step=batches_per_step,
        )
        # Under parameter_server num_replicas_in_sync counts one worker's replicas (its GPUs).
        self.plain_worker_input = not data_lib.uses_distributed_iterator(
            strategy, strategy.num_replicas_in_sync
        )
        logging.info(
            "training input: %s, %s",
            f"the tf.data service at {dispatcher_address} (each example once per epoch)"
            if self.served
            else "each worker's own pipeline",
            "a plain iterator on the worker"
            if self.plain_worker_input
            else "TF's distributed iterator (several accelerator replicas per worker)",
        )
        self._iterator = iter(
            coordinator.create_per_worker_dataset(
                per_worker_dataset_fn(
                    strategy,
                    trainer,
                    num_workers=self.num_workers,
                    dispatcher_address=dispatcher_address,
                    plain=self.plain_worker_input,
                )
            )
        )

    @property
    def steps_per_loop(self) -> int:
        return self.size.value

    def train(self, steps: int, stop: Callable[[], bool] = never) -> LoopResult:
        """Runs `steps` steps as closures of at most steps_per_loop, in batches of a closure per
        worker with the next batch always queued, or fewer once `stop()` says so.

        `stop` is asked each time a batch has finished, while the next one runs:
        on SIGTERM the chief schedules nothing more and returns once that one has
        finished too, so it saves within two batches however far away the next
        hook stop is. The queued batch keeps every worker busy: a worker that
        finishes first takes the next closure instead of waiting for the slowest.
        """
        # Never fewer closures than workers: one long closure would leave the others idle until join.
        size = max(1, min(self.size.value, math.ceil(steps / self.num_workers)))
        start = time.perf_counter()
        full, rest = divmod(steps, size)
        sizes = [size] * full + ([rest] if rest else [])
        parts: list[tuple[int, float, int]] = []
        queued: list[list[tuple[int, Any]]] = []
        for first in range(0, len(sizes), self.num_workers):
            queued.append(self._schedule(sizes[first : first + self.num_workers]))
            if len(queued) == 2:
                parts += self._finish(queued.pop(0))
                if stop():
                    break
        for batch in queued:
            parts += self._finish(batch)
        done_steps = sum(n for n, _, _ in parts)
        if full and done_steps == steps:  # time per full-size closure, as the tuner compares sizes
            self.size.observe(size, (time.perf_counter() - start) * size / steps)
        return combine(parts, self._data_ended(done_steps))

    def _schedule(self, sizes: list[int]) -> list[tuple[int, Any]]:
        """Schedules a closure of each size: [(steps, its RemoteValue)]."""
        return [
            (
                n,
                self.coordinator.schedule(
                    self._loop, args=(self._iterator, tf.constant(n, tf.int64))
                ),
            )
            for n in sizes
        ]

    def _finish(self, scheduled: list[tuple[int, Any]]) -> list[tuple[int, float, int]]:
        """Waits for a batch's results (with the watchdog); each closure's (steps taken, mean loss,
        first non-finite step)."""
        results = watchdog.fetch_closures(
            self.coordinator,
            [remote for _, remote in scheduled],
            timeout_s=self.stall_timeout_s,
            worker_addresses=self.worker_addresses,
        )
        return [self._outcome(n, result) for (n, _), result in zip(scheduled, results)]

    def _outcome(self, n: int, result: tuple) -> tuple[int, float, int]:
        """One finished closure's (steps taken, mean loss, first non-finite step) from its fetched
        result; a served closure that took fewer than `n` steps marks its worker out of data."""
        if not self.served:
            loss, first_bad = result
            return n, float(loss), int(first_bad)
        loss, first_bad, done, worker = result
        if done < n:
            self._workers_out_of_data.add(int(worker))
        return int(done), float(loss), int(first_bad)

    def _data_ended(self, done_steps: int) -> bool:
        """Whether the epoch is consumed: every worker's reader found no more data.

        One reader's end is not the epoch's: another may still hold batches it
        fetched. A worker that died never says so; rounds that find no data at
        all end the epoch without it.
        """
        if not self.served:
            return False
        self._empty_rounds = self._empty_rounds + 1 if done_steps == 0 else 0
        return (
            len(self._workers_out_of_data) >= self.num_workers
            or self._empty_rounds >= EMPTY_ROUNDS_AT_END
        )


def per_worker_dataset_fn(
    strategy: tf.distribute.Strategy,
    trainer: Trainer,
    *,
    num_workers: int,
    dispatcher_address: str | None,
    plain: bool,
) -> Callable:
    """What `ClusterCoordinator.create_per_worker_dataset` runs on each worker: its training input.

    Each worker's own share of the Trainer's pipeline, or (with a dispatcher) the one
    pipeline read in splits from the tf.data service; a plain dataset, or TF's
    distributed one when a worker has several accelerator replicas (`plain`).
    """

    @tf.autograph.experimental.do_not_convert
    def served_dataset_fn(tf_context):
        # One pipeline, read in splits handed out by the dispatcher: no static share.
        whole = trainer.build_train_dataset(data_lib.single_pipeline_context())
        data_service.check_servable(f"{type(trainer).__name__}.build_train_dataset")
        return data_lib.finish(data_service.served(whole, dispatcher_address))

    @tf.autograph.experimental.do_not_convert
    def dataset_fn():
        if dispatcher_address is not None:
            context = data_lib.single_pipeline_context()
            worker_dataset_fn = served_dataset_fn
        else:
            # TF's own context says "pipeline 0 of 1" on every worker (and the function is
            # traced once, on the chief): the worker's index, bound when the dataset is made
            # on each worker, lets shard() give each worker its own share of the data.
            context = data_lib.worker_input_context(num_workers)
            worker_dataset_fn = train_dataset_fn(trainer, context)
        if plain:
            return worker_dataset_fn(context)
        return strategy.distribute_datasets_from_function(worker_dataset_fn)

    return dataset_fn
