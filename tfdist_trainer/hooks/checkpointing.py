"""CheckpointHook: saves every N steps and/or seconds, and at the end."""

from __future__ import annotations

import time

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.hooks.base import Hook


@gin.configurable
class CheckpointHook(Hook):
    """Saves every N steps and/or every T seconds, and at the end."""

    def __init__(self, every_n_steps: int | None = 1000, every_n_seconds: float | None = None):
        if every_n_steps is not None:
            checks.positive_int("train.checkpoint_every_n_steps", every_n_steps)
        if every_n_seconds is not None and (
            isinstance(every_n_seconds, bool)
            or not isinstance(every_n_seconds, (int, float))
            or every_n_seconds <= 0
        ):
            raise ConfigError(
                f"CheckpointHook.every_n_seconds must be a positive number of seconds or None, "
                f"got {every_n_seconds!r}."
            )
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self._last_time = time.monotonic()

    def begin(self, run):
        # the clock starts with training, not when gin built the hook
        self._last_time = time.monotonic()

    def after_loop(self, run, result):
        by_time = (
            bool(self.every_n_seconds)
            and time.monotonic() - self._last_time >= self.every_n_seconds
        )
        # Every multi_worker_mirrored worker must take part in a save: agree on time-based ones.
        if self._due(run.step) or run.agree(by_time):
            run.save_checkpoint()
            self._last_time = time.monotonic()

    def end(self, run):
        run.save_checkpoint()
