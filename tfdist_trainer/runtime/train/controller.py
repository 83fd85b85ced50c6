"""The training task's outer loop: build, then step loops and hooks until the target step.

Like Orbit's `Controller.train`: everything the task is made of comes from
`setup.build_run` (strategy, state, restore, loop, hooks); the task's own
protocols (SIGTERM, a preempted ps, served data ending, the run files) are hooks
after the user's (`task_hooks`). What stays here is the loop itself.

Each `run.train` goes to the next hook stop (a log record, a checkpoint...),
which may be thousands of steps away; the step loop asks `run.stop` between
its `tf.function` calls (parameter_server: between batches of closures) and
returns early on a SIGTERM or a ps's save request, so the hooks' `after_loop`
saves within one call of the signal, whatever `log_every_n_steps` is.
"""

from __future__ import annotations

import time
from typing import Any

from absl import logging

from tfdist_trainer.hooks import StopTraining
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.runtime.state import weights_fingerprint
from tfdist_trainer.runtime.statistics import agree_on_weights
from tfdist_trainer.runtime.train.setup import build_run


def run_training(experiment: Experiment, cluster: ClusterConfig, model_dir: str) -> dict[str, Any]:
    """Trains until ``train.train_steps`` (or a hook stops it); returns the last train and eval values."""
    run = build_run(experiment, cluster, model_dir)
    context, hooks = run.context, run.hooks
    start_step, start_time = context.step, time.monotonic()
    for hook in hooks:
        hook.begin(context)
    try:
        while context.step < context.target_step:
            result = run.train(context.next_loop_end(hooks) - context.step)
            context.refresh_step()
            for hook in hooks:
                hook.after_loop(context, result)
    except StopTraining as stop:
        logging.info("stopping early: %s", stop)
    for hook in hooks:
        hook.end(context)
    context.wait_for_checkpoints()  # the task returns with every checkpoint it asked for durable
    fingerprint = weights_fingerprint(context.trainer.model)
    logging.info(
        "training done at step %d in %.1fs (%d steps this run); weights fingerprint %s",
        context.step,
        time.monotonic() - start_time,
        context.step - start_step,
        fingerprint,
    )
    agree_on_weights(
        context.trainer.model, fingerprint, context.max_over_workers, is_chief=cluster.is_chief
    )
    run.runtime.finish_job(cluster)  # the orderly end: a coordination leader exits last
    return {"step": context.step, **context.last_train, **context.last_eval}
