"""EvalHook: inline evaluation every `train.eval_every_n_steps` (when the cluster has no evaluator task)."""

from __future__ import annotations

import gin

from tfdist_trainer.hooks.base import Hook


@gin.configurable
class EvalHook(Hook):
    """The run's one evaluation schedule: every N steps (None: only at the end) and at the end.

    Without an evaluator task the training tasks evaluate inline and record
    eval_* metrics. With one, they never evaluate (Estimator's
    train_and_evaluate): the evaluator evaluates every checkpoint, so at each
    of these steps the chief saves one for it, and the evaluator's results
    are taken into metrics.jsonl (and `run.last_eval`) as they come.
    """

    def __init__(self, every_n_steps: int | None = None):
        self.every_n_steps = every_n_steps

    def begin(self, run):
        if run.has_evaluator_task:
            run.log_info(
                "evaluation: by the evaluator task, of every checkpoint%s",
                f" (one is saved every {self.every_n_steps} steps for it)"
                if self.every_n_steps
                else "",
            )

    def after_loop(self, run, result):
        if not self._due(run.step) or run.step >= run.target_step:
            return
        if run.has_evaluator_task:
            # Every synchronous worker takes part; the evaluator sees it once it is complete.
            run.save_checkpoint()
            run.take_evaluator_results()
        else:
            run.evaluate()

    def end(self, run):
        if run.has_evaluator_task:
            run.take_evaluator_results()  # the final checkpoint's come from the evaluator later
        elif run.last_eval_step != run.step:
            run.evaluate()
