"""The training state of one task: the user's model, optimizer and metrics, built under the strategy.

Everything is created here, under the strategy's scope, never lazily inside
a step: variables land where the scope (or a model_parallel plan) puts them
only when they are created outside a `tf.function`.
"""

from __future__ import annotations

import hashlib
import re

import keras
import tensorflow as tf
from absl import logging

from tfdist_trainer import sharding, tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.io import storage
from tfdist_trainer.runtime import whole_tables
from tfdist_trainer.runtime.logs import layer_table
from tfdist_trainer.runtime.strategies import StrategyRuntime
from tfdist_trainer.sharding import runtime_api as tables
from tfdist_trainer.trainers import clipping, compiled, sparse_reduce
from tfdist_trainer.trainers.trainer import Trainer
from tfdist_trainer.variables import format_bytes, write_report


def build_model(trainer: Trainer, runtime: StrategyRuntime | None = None) -> keras.Model:
    """Builds the user's model with all its variables, never lazily inside a step.

    Variables land where the current scope (or a model_parallel plan) places
    them only when they are created here, not when a `tf.function` first
    calls the model.
    """
    model = trainer.build_model()
    if runtime is not None:
        model = runtime.prepare_model(model)
    if not model.built or (runtime is not None and runtime.calls_model_once):
        features, _, _ = compiled.example_batch(trainer)  # zeros shaped like one example
        model(features, training=False)
    if runtime is not None:
        runtime.model_built(model)
    return model


def build_state(
    trainer: Trainer,
    strategy: tf.distribute.Strategy,
    *,
    with_optimizer: bool = True,
    runtime: StrategyRuntime | None = None,
) -> tuple[tf.Variable, tf.train.Checkpoint]:
    """Creates model, optimizer, metrics and global step under the scope; returns (global_step, checkpoint)."""
    with strategy.scope(), sharding.record_all_variables():
        # The placement scope lets self-sharding layers balance bytes against every variable.
        trainer.model = build_model(trainer, runtime)
        compiled.prepare(trainer)  # a compiled model's loss state, before any step
        trainer.train_metrics = trainer.build_metrics()
        trainer.eval_metrics = [keras.metrics.Mean(name="loss")] + trainer.build_metrics()
        global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        items = {"model": trainer.model, "global_step": global_step}
        if with_optimizer:
            trainer.optimizer = trainer.build_optimizer()
            if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
                trainer.optimizer, keras.optimizers.LossScaleOptimizer
            ):
                # float16 gradients underflow without loss scaling; Trainer.train_step scales the loss.
                trainer.optimizer = keras.optimizers.LossScaleOptimizer(trainer.optimizer)
            _refuse_keras_accumulation(trainer)
            trainer.optimizer.build(trainer.model.trainable_variables)
            # With clipping on, the global gradient norm before clipping is reported with the
            # train metrics (apply_gradients updates it; the batch's metrics do not see it).
            trainer.gradient_norm = clipping.gradient_norm_metric(trainer.optimizer)
            if strategy.num_replicas_in_sync > 1:
                # The tables' sparse gradients in one all-gather, not ~4 collectives each.
                tf_compat.replace_gradient_all_reduce(
                    trainer.optimizer, sparse_reduce.all_reduce_sum
                )
            items["optimizer"] = trainer.optimizer
        if runtime is not None:
            # parameter_server's workers update them concurrently: its runtime makes that atomic.
            runtime.metrics_built(
                trainer.train_metrics + trainer.eval_metrics + _reported_only(trainer)
            )
            runtime.state_built(trainer)
    return global_step, tf.train.Checkpoint(**items)


def _reported_only(trainer: Trainer) -> list:
    """Metrics the runtime updates itself and reports with the train metrics."""
    return [trainer.gradient_norm] if trainer.gradient_norm is not None else []


def _refuse_keras_accumulation(trainer: Trainer) -> None:
    """Keras' own gradient accumulation puts the update in a tf.cond, where merge_call fails under
    multi_worker_mirrored and parameter_server: point to the trainer's, which works everywhere."""
    k = getattr(trainer.optimizer, "gradient_accumulation_steps", None)
    if k:
        raise ConfigError(
            f"{type(trainer).__name__}.build_optimizer returns an optimizer with "
            f"gradient_accumulation_steps={k}, which fails under multi_worker_mirrored and "
            f"parameter_server (Keras updates inside a tf.cond); drop it and set "
            f"train.gradient_accumulation_steps = {k} instead (the same arithmetic, every strategy)."
        )


#: The whole variable placement table, written by the chief next to its checkpoints.
PLACEMENT_REPORT = "variable_placement.json"
#: Variables of fewer bytes than this in all are not worth a ps imbalance on the console.
IMBALANCE_WORTH_BYTES = 64 * 2**20


def log_placement(trainer: Trainer, whole_table_warning_bytes: int | None = None) -> None:
    """Where every variable lives, once, on the chief: one summary line for the console
    (variables, bytes per task, the ps imbalance, the largest variable), a warning for each
    variable of at least `whole_table_warning_bytes` placed whole on one ps; the whole table (variable, shape, bytes,
    device) in the task's log, logged from `runtime.logs.layer_table`, a source the
    launcher's console filter keeps in the log, and in model_dir/variable_placement.json."""
    variables = list(trainer.model.variables) + (
        list(trainer.optimizer.variables) if trainer.optimizer else []
    )
    records = sharding.placement_records(variables)
    if whole_table_warning_bytes is not None:
        whole_tables.warn_whole_on_ps(records["variables"], variables, whole_table_warning_bytes)
    biggest = whole_tables.largest(records["variables"])
    largest = (
        f"; largest {biggest['name']} {format_bytes(biggest['bytes'])} on "
        f"{_task_name(tables.task_of(biggest['device']))}"
        if biggest
        else ""
    )
    per_task = records["bytes_per_task"]
    total = sum(per_task.values())
    where = ", ".join(
        f"{_task_name(task)} {format_bytes(size)} ({100 * size / max(1, total):.0f}%)"
        for task, size in per_task.items()
    )
    ps = sum("/job:ps/" in task for task in per_task)
    percent = 100 * records["ps_imbalance"]
    imbalance = (
        f"; ps imbalance {percent:.1f}%" if percent < 100 else f"; ps imbalance {percent:,.0f}%"
    )
    # Only where it matters: a few MiB of variables fit any ps, however they are spread (MNIST's
    # 2.6 MiB over 4 ps read "ps imbalance 274,572%").
    imbalance = imbalance if ps > 1 and total >= IMBALANCE_WORTH_BYTES else ""
    model_dir = getattr(getattr(trainer, "context", None), "model_dir", None)
    report = storage.join(model_dir, PLACEMENT_REPORT) if model_dir else None
    logging.info(
        "variable placement: %d variables, %s: %s%s%s (the whole table: this task's log%s)",
        len(records["variables"]),
        format_bytes(total),
        where,
        imbalance,
        largest,
        f" and {report}" if report else "",
    )
    layer_table.log(["variable placement:", *sharding.placement_table(variables).splitlines()])
    if report:
        try:
            write_report(report, records)
        except storage.write_errors() as e:  # a report is never worth failing the training
            logging.warning("could not write %s: %s", report, str(e).strip().splitlines()[0])


def _task_name(task: str) -> str:
    """'/job:ps/replica:0/task:1' -> 'ps:1'; a mirrored variable's devices are counted."""
    if task.startswith("mirrored:"):
        return f"mirrored on {task.count(',') + 1} devices"
    match = re.search(r"/job:([\w\-]+)/replica:\d+/task:(\d+)", task)
    return f"{match.group(1)}:{match.group(2)}" if match else task


#: Above this many parameters the fingerprint is skipped: it would pull every table to this task.
FINGERPRINT_MAX_PARAMS = 50_000_000


def weights_fingerprint(model: keras.Model) -> str:
    """A short hash of this task's copy of the weights: synchronous workers must agree on it."""
    if model.count_params() > FINGERPRINT_MAX_PARAMS:
        return f"skipped ({model.count_params():,} parameters)"
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()[:16]
