"""The loop of the synchronous strategies: the task runs its step loops itself."""

from __future__ import annotations

import time
from collections.abc import Callable

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
from tfdist_trainer.trainers import data as data_lib
from tfdist_trainer.trainers.trainer import Trainer


class TrainLoop:
    """Runs training steps under a synchronous strategy (one_device, mirrored, multi_worker_mirrored, model_parallel).

    The input comes from `data.SyncInput`: a plain iterator on the host, not TF's
    distributed iterator, wherever each process has one replica or its replicas
    are CPUs (the distributed iterator costs ~2x the CPU per batch there).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        trainer: Trainer,
        global_step: tf.Variable,
        steps_per_loop: int | StepsPerLoopTuner,
        *,
        jit_compile: bool = False,
        step_fn: Callable | None = None,
        batches_per_step: int = 1,
    ):
        self.strategy = strategy
        self.size = as_loop_size(steps_per_loop)
        self.input = data_lib.SyncInput(strategy, train_dataset_fn(trainer))
        self._loop = train_loop_fn(
            strategy,
            trainer,
            global_step,
            jit_compile,
            step_fn,
            self.input.next_batch,
            batches_per_step=batches_per_step,
        )
        self._iterator = self.input.iterator
        logging.info("training input: %s", self.input.describe())

    @property
    def steps_per_loop(self) -> int:
        return self.size.value

    def train(self, steps: int, stop: Callable[[], bool] = never) -> LoopResult:
        """Runs `steps` steps in calls of at most steps_per_loop, or fewer once `stop()` says so.

        `stop` is asked between calls (not before the first: the caller has just
        checked), so a SIGTERM is honoured after the call that was running
        however far away the next hook stop is. A check between calls costs no
        step a host sync: each call already ends in one (its loss).
        """
        parts, done = [], 0
        while done < steps and not (parts and stop()):
            n = min(self.size.value, steps - done)
            start = time.perf_counter()
            loss, first_bad = self._loop(self._iterator, tf.constant(n, tf.int64))
            parts.append((n, float(loss), int(first_bad)))  # float() waits for the call to finish
            self.size.observe(n, time.perf_counter() - start)
            done += n
        return combine(parts)
