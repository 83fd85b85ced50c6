"""The evaluator side-car: evaluates each new checkpoint in model_dir until training is over."""

from __future__ import annotations

import time

import tensorflow as tf
from absl import logging

from tfdist_trainer import loops, markers, storage
from tfdist_trainer.cluster import EVALUATOR
from tfdist_trainer.errors import ConfigError, EvaluatorTimeout
from tfdist_trainer.experiment import Experiment
from tfdist_trainer.hooks import SideCarEvaluation
from tfdist_trainer.logs import MetricsRecord, Summaries, report_eval, trainer_tags
from tfdist_trainer.state import build_state
from tfdist_trainer.task import TaskContext


def run_evaluator(
    experiment: Experiment,
    model_dir: str,
    *,
    timeout_s: float,
    context: TaskContext | None = None,
) -> dict[str, float]:
    """Evaluates each new checkpoint in model_dir until training is over.

    Stops after the checkpoint at ``train_steps``, or after the last one when the
    chief marks training done earlier (a hook stopped it). `context` is the
    evaluator task's (`Trainer.context`); None makes one from model_dir alone.
    """
    trainer = experiment.trainer_cls()
    trainer.context = context or TaskContext(
        model_dir=model_dir,
        task_type=EVALUATOR,
        is_chief=False,
        strategy=experiment.strategy_config.name,
    )
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
        evaluation = SideCarEvaluation(
            model_dir=model_dir,
            step=step,
            values=values,
            checkpoint=path,
            export=lambda target: trainer.model.export(
                target, format="tf_saved_model", verbose=False
            ),
        )
        for hook in experiment.hooks:  # the same gin config: e.g. BestExporter exports here
            hook.after_side_car_eval(evaluation)
        last_activity = time.monotonic()
        if step >= experiment.train_steps:
            break
    return values
