"""The evaluator side-car: evaluates each new checkpoint in model_dir until training is over."""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from tfdist_trainer import loops, markers, storage
from tfdist_trainer.errors import ConfigError, EvaluatorTimeout
from tfdist_trainer.experiment import Experiment
from tfdist_trainer.logs import MetricsRecord, Summaries, report_eval, trainer_tags
from tfdist_trainer.state import build_state


def run_evaluator(experiment: Experiment, model_dir: str, *, timeout_s: float) -> dict[str, float]:
    """Evaluates each new checkpoint in model_dir until training is over.

    Stops after the checkpoint at ``train_steps``, or after the last one when the
    chief marks training done earlier (a hook stopped it).
    """
    trainer = experiment.trainer_cls()
    global_step, checkpoint = build_state(
        trainer, tf.distribute.get_strategy(), with_optimizer=False
    )
    evaluator = loops.EvalLoop(trainer, None, distributed=False)
    if not evaluator.enabled:
        raise ConfigError(
            f"{type(trainer).__name__}.build_eval_dataset returned None; the evaluator has nothing to do."
        )
    record = MetricsRecord(storage.join(model_dir, "eval", "metrics.jsonl"))
    summaries = Summaries(model_dir, enabled=True)
    tags = trainer_tags(trainer)
    values: dict[str, float] = {}
    last_activity = time.monotonic()

    def finished() -> bool:
        done = markers.done_step(model_dir)
        if done is not None and done <= int(global_step.numpy()):
            return True
        if time.monotonic() - last_activity > timeout_s:
            raise EvaluatorTimeout(
                f"no new checkpoint appeared in {model_dir} for {timeout_s:g}s before step "
                f"{experiment.train_steps}; is the chief running?"
            )
        return False

    for path in tf.train.checkpoints_iterator(
        model_dir, min_interval_secs=1, timeout=2, timeout_fn=finished
    ):
        checkpoint.restore(path).expect_partial()
        step = int(global_step.numpy())
        values = report_eval(
            evaluator.evaluate(),
            step=step,
            tags=tags,
            record=record,
            summaries=summaries,
            log=logging.info,
            checkpoint=path,
        )
        last_activity = time.monotonic()
        if step >= experiment.train_steps:
            break
    return values
