"""Profiler: a TensorBoard profile of a range of steps (`train.profile_steps = (first, last)`)."""

from __future__ import annotations

import gin

from tfdist_trainer.hooks.base import Hook


@gin.configurable
class Profiler(Hook):
    """Records global steps `first`..`last` with TensorFlow's profiler, under model_dir/train.

    Loops end right before `first` and right after `last`, so the trace holds exactly
    those steps (with steps_per_loop > 1, whole loop calls of them). The chief profiles,
    and under multi_worker_mirrored every worker does (each into its own directory);
    TensorBoard's Profile tab reads ``plugins/profile/``.
    """

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self._on = False

    def next_stop(self, step: int) -> int | None:
        stops = [s for s in (self.first - 1, self.last) if s > step]
        return min(stops) if stops else None

    def begin(self, run):
        self._switch(run)

    def after_loop(self, run, result):
        self._switch(run)

    def end(self, run):
        if self._on:
            run.stop_profiler()
            self._on = False

    def _switch(self, run) -> None:
        wanted = self.first - 1 <= run.step < self.last
        if wanted and not self._on:
            run.start_profiler(self.first, self.last)
        elif self._on and not wanted:
            run.stop_profiler()
        self._on = wanted
