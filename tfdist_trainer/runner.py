"""What one task does once the cluster is known: train, serve or evaluate.

`Experiment` holds the job-level knobs bound in gin as ``train.*``. The
training controller is deliberately small: build the state under the
strategy's scope, restore, then alternate `loop.train(n)` with reporting,
checkpoints and evaluation until the global step reaches ``train_steps``.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist_trainer import data as data_lib
from tfdist_trainer import loops
from tfdist_trainer.checkpoints import Checkpointer
from tfdist_trainer.cluster import CHIEF, ClusterConfig, is_listening
from tfdist_trainer.logs import MetricsRecord, read_records
from tfdist_trainer.strategies import OneDevice, StrategyConfig, as_strategy_config
from tfdist_trainer.trainer import Trainer


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or Inf; no checkpoint is written for that state."""


@gin.configurable("train")
class Experiment:
    """Job-level settings (gin: ``train.trainer_cls = @MyTrainer``, ``train.strategy = @mirrored``...).

    Args:
      trainer_cls: the user's Trainer subclass.
      strategy: one of @one_device, @mirrored, @multi_worker_mirrored, @parameter_server.
      train_steps: the global step at which training stops (exact under every strategy).
      steps_per_loop: steps per `tf.function` call (or per scheduled closure); None takes the
        strategy's default.
      log_every_n_steps: progress and train-metric reports.
      eval_every_n_steps: inline evaluation interval; None evaluates only at the end.
      checkpoint_every_n_steps: None saves only at the end.
      keep_checkpoints: how many checkpoints to keep.
      seed: seeds Python, NumPy and TF for reproducible runs; None leaves them random.
    """

    def __init__(self, *, trainer_cls: type[Trainer] | None = None, strategy: Any = OneDevice,
                 train_steps: int = 1000, steps_per_loop: int | None = None,
                 log_every_n_steps: int = 100, eval_every_n_steps: int | None = None,
                 checkpoint_every_n_steps: int | None = 1000, keep_checkpoints: int = 3,
                 seed: int | None = None):
        if trainer_cls is None:
            raise ValueError("train.trainer_cls is not set; bind it in gin, e.g. train.trainer_cls = @MyTrainer.")
        if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
            raise ValueError(f"train.trainer_cls must be a subclass of tfdist_trainer.Trainer, got {trainer_cls!r}.")
        for name, value in (("train_steps", train_steps), ("log_every_n_steps", log_every_n_steps)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"train.{name} must be a positive integer, got {value!r}.")
        for name, value in (("steps_per_loop", steps_per_loop), ("eval_every_n_steps", eval_every_n_steps),
                            ("checkpoint_every_n_steps", checkpoint_every_n_steps)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"train.{name} must be a positive integer or None, got {value!r}.")
        self.trainer_cls = trainer_cls
        self.strategy_config: StrategyConfig = as_strategy_config(strategy)
        self.train_steps = train_steps
        self.steps_per_loop = steps_per_loop or self.strategy_config.default_steps_per_loop
        self.log_every_n_steps = log_every_n_steps
        self.eval_every_n_steps = eval_every_n_steps
        self.checkpoint_every_n_steps = checkpoint_every_n_steps
        self.keep_checkpoints = keep_checkpoints
        self.seed = seed


# -- state ---------------------------------------------------------------------

def _example_batch(trainer: Trainer) -> Any:
    """A one-example batch of zeros shaped like the training features, to build a lazy model."""
    spec = trainer.build_train_dataset(data_lib.single_pipeline_context()).element_spec
    features_spec = spec[0] if isinstance(spec, tuple) else spec

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros([1] + shape[1:], s.dtype)
    return tf.nest.map_structure(zeros, features_spec)


def build_state(trainer: Trainer, strategy: tf.distribute.Strategy, *, with_optimizer: bool = True
                ) -> tuple[tf.Variable, tf.train.Checkpoint]:
    """Creates model, optimizer, metrics and global step under the scope; returns (global_step, checkpoint).

    Everything is built eagerly here, never lazily inside a step, so that
    variables land where the strategy places them.
    """
    with strategy.scope():
        trainer.model = trainer.build_model()
        if not trainer.model.built:
            trainer.model(_example_batch(trainer), training=False)
        trainer.train_metrics = trainer.build_metrics()
        trainer.eval_metrics = trainer.build_metrics()
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        items = {"model": trainer.model, "global_step": global_step}
        if with_optimizer:
            trainer.optimizer = trainer.build_optimizer()
            trainer.optimizer.build(trainer.model.trainable_variables)
            items["optimizer"] = trainer.optimizer
    return global_step, tf.train.Checkpoint(**items)


# -- training ------------------------------------------------------------------

def _format_metrics(values: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in values.items())


def run_training(experiment: Experiment, cluster: ClusterConfig, model_dir: str) -> dict[str, Any]:
    """Trains until ``train.train_steps``; returns the final record (loss, eval metrics)."""
    config = experiment.strategy_config
    if experiment.seed is not None:
        keras.utils.set_random_seed(experiment.seed)
    config.prepare_devices()
    strategy = config.create(cluster)
    coordinator = config.create_coordinator(strategy)
    logging.info("strategy %s with %d replica(s) in sync", config.name, strategy.num_replicas_in_sync)

    trainer = experiment.trainer_cls()
    global_step, checkpoint = build_state(trainer, strategy)
    checkpointer = Checkpointer(model_dir=model_dir, cluster=cluster, checkpoint=checkpoint,
                                global_step=global_step, every_n_steps=experiment.checkpoint_every_n_steps,
                                keep=experiment.keep_checkpoints)
    checkpointer.restore()
    if coordinator is None:
        loop = loops.TrainLoop(strategy, trainer, global_step, experiment.steps_per_loop)
    else:
        loop = loops.ScheduledTrainLoop(strategy, coordinator, trainer, global_step, experiment.steps_per_loop)
    evaluator = loops.EvalLoop(trainer, strategy, distributed=coordinator is None)
    record = MetricsRecord(os.path.join(model_dir, "metrics.jsonl"), enabled=cluster.is_chief)
    tags = trainer_tags(trainer)

    step = int(global_step.numpy())
    start_step, start_time = step, time.monotonic()
    final: dict[str, Any] = {"step": step}
    while step < experiment.train_steps:
        boundaries = [experiment.train_steps, _next_multiple(step, experiment.log_every_n_steps)]
        for every in (experiment.checkpoint_every_n_steps, experiment.eval_every_n_steps):
            if every:
                boundaries.append(_next_multiple(step, every))
        steps = min(boundaries) - step
        loop_start = time.monotonic()
        loss = loop.train(steps)
        elapsed = time.monotonic() - loop_start
        step = int(global_step.numpy())
        if not math.isfinite(loss):
            raise NonFiniteLossError(
                f"the training loss became {loss} between steps {step - steps} and {step}; "
                f"no checkpoint was written for it. Lower the learning rate or check the data.")
        train_values = {"loss": loss, **loops.metric_values(trainer.train_metrics)}
        for metric in trainer.train_metrics:
            metric.reset_state()
        steps_per_s = steps / max(elapsed, 1e-9)
        remaining = (experiment.train_steps - step) / steps_per_s
        logging.info("step %d/%d %s steps/s=%.1f examples/s=%.0f ETA=%.0fs%s", step, experiment.train_steps,
                     _format_metrics(train_values), steps_per_s, steps_per_s * trainer.global_batch_size,
                     remaining, _format_tags(tags))
        record.write(kind="train", step=step, steps_per_s=steps_per_s, **train_values, **tags)
        final = {"step": step, **train_values}
        if checkpointer.due(step):
            checkpointer.save(step)
        if experiment.eval_every_n_steps and step % experiment.eval_every_n_steps == 0 and step < experiment.train_steps:
            _evaluate_and_report(evaluator, step, record, tags)
    checkpointer.save(step)
    final.update(_evaluate_and_report(evaluator, step, record, tags))
    logging.info("training done at step %d in %.1fs (%d steps this run)", step,
                 time.monotonic() - start_time, step - start_step)
    return final


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def trainer_tags(trainer: Trainer) -> dict[str, str]:
    tags = getattr(trainer, "record_tags", None)
    return dict(tags() if callable(tags) else tags or {})


def _format_tags(tags: dict[str, str]) -> str:
    return "".join(f" [{k}: {v}]" for k, v in tags.items())


def _evaluate_and_report(evaluator: loops.EvalLoop, step: int, record: MetricsRecord,
                         tags: dict[str, str]) -> dict[str, float]:
    if not evaluator.enabled:
        return {}
    values = {f"eval_{k}": v for k, v in evaluator.evaluate().items()}
    logging.info("eval at step %d: %s%s", step, _format_metrics(values), _format_tags(tags))
    record.write(kind="eval", step=step, **values, **tags)
    return values


# -- serving (ps and workers under parameter_server) ---------------------------

def serve(cluster: ClusterConfig, *, chief_gone_grace_s: float, poll_s: float = 1.0) -> None:
    """Runs this task's TF server until the chief has come and gone, then returns (exit 0).

    A server has no natural end; without this, ps and worker processes started
    by hand would outlive the job forever.
    """
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.training_cluster()), job_name=cluster.task_type,
        task_index=cluster.task_id, protocol=cluster.rpc_layer, start=True)
    logging.info("serving at %s", server.target)
    chief = cluster.tasks((CHIEF,))[0]
    seen, gone_since, last_note = False, None, time.monotonic()
    while True:
        up = is_listening(chief, timeout=1.0)
        now = time.monotonic()
        if up:
            if not seen:
                logging.info("chief %s is up", chief.address)
            seen, gone_since = True, None
        elif seen:
            gone_since = gone_since or now
            if now - gone_since >= chief_gone_grace_s:
                logging.info("chief has been gone for %.0fs: the job is over, exiting", now - gone_since)
                return
        elif now - last_note > 30:
            logging.info("waiting for the chief at %s", chief.address)
            last_note = now
        time.sleep(poll_s)


# -- the evaluator side-car -----------------------------------------------------

def run_evaluator(experiment: Experiment, model_dir: str, *, timeout_s: float) -> dict[str, float]:
    """Evaluates each new checkpoint in model_dir; returns after the one at ``train_steps``."""
    trainer = experiment.trainer_cls()
    strategy = tf.distribute.get_strategy()
    global_step, checkpoint = build_state(trainer, strategy, with_optimizer=False)
    evaluator = loops.EvalLoop(trainer, None, distributed=False)
    if not evaluator.enabled:
        raise ValueError(f"{type(trainer).__name__}.build_eval_dataset returned None; the evaluator has nothing to do.")
    record = MetricsRecord(os.path.join(model_dir, "eval", "metrics.jsonl"))
    tags = trainer_tags(trainer)
    values: dict[str, float] = {}
    for path in tf.train.checkpoints_iterator(model_dir, min_interval_secs=1, timeout=timeout_s):
        checkpoint.restore(path).expect_partial()
        step = int(global_step.numpy())
        values = _evaluate_and_report(evaluator, step, record, tags)
        if step >= experiment.train_steps:
            return values
    raise TimeoutError(f"no new checkpoint appeared in {model_dir} for {timeout_s:g}s before step "
                       f"{experiment.train_steps}; is the chief running?")
