"""NanGuard: a non-finite loss rolls back to the last checkpoint (a few times), then stops the run."""

from __future__ import annotations

import math

import gin
from absl import logging

from tfdist_trainer.errors import ConfigError, NonFiniteLossError
from tfdist_trainer.hooks.base import Hook


@gin.configurable
class NanGuard(Hook):
    """Stops on a NaN/Inf loss naming the step, or restores the last checkpoint and retries.

    Runs before the checkpoint hook, so no checkpoint ever holds the bad state.
    """

    def __init__(self, max_retries: int = 0):
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"NanGuard.max_retries must be an integer >= 0, got {max_retries!r}.")
        self.max_retries = max_retries
        self.retries = 0

    def after_loop(self, run, result):
        if result.first_nonfinite_step is None and math.isfinite(result.loss):
            return
        step = result.first_nonfinite_step or run.step
        run.wait_for_checkpoints()  # a save in flight is the newest one to go back to
        restored = run.checkpointer.latest_step()
        if self.retries < self.max_retries and restored is not None:
            self.retries += 1
            logging.warning(
                "loss became %s at step %d; restoring the checkpoint of step %d and retrying "
                "(%d/%d)",
                result.loss,
                step,
                restored,
                self.retries,
                self.max_retries,
            )
            run.checkpointer.restore()
            run.refresh_step()
            run.take_train_metrics()  # the rolled-back steps must not count in the next record
            result.retried = True
            return
        kept = (
            f"the last good checkpoint (step {restored}) is kept"
            if restored is not None
            else "no checkpoint was written"
        )
        retry = (
            "set NanGuard.max_retries to restore and retry"
            if not self.max_retries
            else f"raise NanGuard.max_retries (its {self.max_retries} used up)"
            if restored is not None
            else "checkpoint more often (NanGuard retries from a checkpoint)"
        )
        raise NonFiniteLossError(
            f"the training loss became NaN or Inf at step {step}; {kept}. Lower the learning rate, "
            f"check the data, or {retry}."
        )
