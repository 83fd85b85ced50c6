"""How many steps one loop call takes: fixed, or tuned from measured throughput ('auto')."""

from __future__ import annotations

from collections.abc import Callable

from absl import logging


class StepsPerLoopTuner:
    """`steps_per_loop='auto'`: doubles the steps per call while throughput still improves.

    Like tf-keras's StepsPerExecutionTuner, but for every strategy: each
    candidate is timed over `calls_per_trial` full-size calls (the first call,
    which traces, is not timed). A doubling that beats the best size so far
    by less than `min_gain` is a miss; after `patience` + 1 misses in a row the
    search settles on the best size. The one extra try matters on busy hosts,
    where one noisy trial can hide a real gain (measured under parameter_server:
    settling at the first miss kept 8 steps per loop where 100 was 10% faster).
    Synchronous workers must issue identical calls, so with `agree` (max over
    workers) every decision is taken jointly.
    """

    def __init__(
        self,
        initial: int = 8,
        maximum: int = 1024,
        min_gain: float = 0.05,
        calls_per_trial: int = 2,
        patience: int = 1,
        agree: Callable[[int], int] | None = None,
    ):
        self.value = initial
        self.maximum = maximum
        self.min_gain = min_gain
        self.calls_per_trial = calls_per_trial
        self.patience = patience
        self.agree = agree or (lambda v: v)
        self.frozen = False
        self._warm = False
        self._best: tuple[float, int] | None = None
        self._misses = 0
        self._trial_steps, self._trial_seconds, self._trial_calls = 0, 0.0, 0

    def observe(self, steps: int, seconds: float) -> None:
        if self.frozen or steps < self.value:
            return  # a short call at a boundary says nothing about this size
        if not self._warm:
            self._warm = True
            return
        self._trial_steps += steps
        self._trial_seconds += seconds
        self._trial_calls += 1
        if self._trial_calls < self.calls_per_trial:
            return
        rate = self._trial_steps / max(self._trial_seconds, 1e-9)
        self._trial_steps, self._trial_seconds, self._trial_calls = 0, 0.0, 0
        if self._best is None or rate > self._best[0] * (1 + self.min_gain):
            self._best, self._misses = (rate, self.value), 0
        else:
            self._misses += 1
        searching = self._misses <= self.patience and self.value * 2 <= self.maximum
        if self.agree(int(searching)):
            self.value *= 2
        else:
            self.value = self.agree(self._best[1])
            self.frozen = True
            logging.info(
                "steps_per_loop='auto' settled on %d (%.1f steps/s)", self.value, self._best[0]
            )


def search_maximum(
    initial: int, train_steps: int, hook_spacing: int | None = None, ceiling: int = 1024
) -> int:
    """The largest size the 'auto' search may try, so that it settles and reports within the run.

    A search that doubles while noise looks like a gain spends `initial` (the
    traced call) plus two calls of every size it tries; past half the run it
    would still be searching when training ends (seen on a loaded CI host:
    2,500 steps and no size reported). Nor is a size beyond the spacing of hook
    stops worth trying: a call never runs past the next stop, so such a size
    only ever sees short calls, which the tuner ignores.
    """
    bound = min(ceiling, hook_spacing or ceiling)
    size, spent = initial, 3 * initial
    while size * 2 <= bound and spent + 4 * size <= train_steps // 2:
        size *= 2
        spent += 2 * size
    return size


class FixedStepsPerLoop:
    """A fixed number of steps per call."""

    def __init__(self, value: int):
        self.value = value

    def observe(self, steps: int, seconds: float) -> None:
        pass


def as_loop_size(steps_per_loop: int | StepsPerLoopTuner) -> FixedStepsPerLoop | StepsPerLoopTuner:
    """A fixed size for an int; a tuner as it is (the one rule both step loops follow)."""
    return FixedStepsPerLoop(steps_per_loop) if isinstance(steps_per_loop, int) else steps_per_loop
