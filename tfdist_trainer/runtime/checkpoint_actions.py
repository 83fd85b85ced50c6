"""What a user does with a checkpoint without training: evaluate it once, or export it.

Estimator's `evaluate()` and `export_saved_model()`; Model Garden's ``--mode=eval``.
Both run in this one process, outside any cluster, as the evaluator side-car does
(with an optimizer that keeps moving averages, they read and use the averages):
the model is built without a distribution strategy and reads the checkpoint, so a
checkpoint of any strategy (variables on ps tasks, sharded tables) works. Reading is
checked: a checkpoint of another model is one sentence, not a half-restored model.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.io import storage
from tfdist_trainer.io.records import MetricsRecord
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import checkpoints, ema, export, loops
from tfdist_trainer.runtime.logs import Summaries, report_eval, trainer_tags
from tfdist_trainer.runtime.state import build_model, build_state

#: metrics.jsonl's `evaluated_by` for an evaluation asked for by --mode=evaluate.
EVALUATED_BY = "evaluate"


def checkpoint_to_read(model_dir: str, checkpoint: str | None) -> str:
    """`checkpoint`, or model_dir's newest with an index (listed, else found beside a damaged
    ``checkpoint`` file); one sentence when there is none."""
    newest = (
        p
        for p in checkpoints.listed_newest_first(model_dir)
        + checkpoints.found_newest_first(model_dir)
        if storage.exists(f"{p}.index")
    )
    prefix = checkpoint or next(newest, None)
    if prefix is None:
        raise ConfigError(
            f"--model_dir {model_dir} holds no checkpoint; train there first, or name one with "
            f"--checkpoint=PATH (a prefix such as {storage.join(model_dir, 'ckpt-100')})."
        )
    if not storage.exists(f"{prefix}.index"):
        raise ConfigError(
            f"--checkpoint {prefix} is not a checkpoint ({prefix}.index does not exist); name a "
            f"prefix such as ckpt-100, without .index."
        )
    return prefix


def read_checked(checkpoint: tf.train.Checkpoint, prefix: str, what: str) -> None:
    """Restores `prefix` into `checkpoint`; one sentence unless every variable of `what` was found.

    The read is partial on purpose: evaluating or exporting needs the model's variables, not the
    optimizer's slots and step counter the checkpoint also holds. Said so once (`expect_partial`);
    TensorFlow otherwise warned once per unread value (45 lines for the MNIST recipe, read by a
    newcomer as a broken checkpoint).
    """
    try:
        status = checkpoint.read(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()
    except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise checkpoints.model_mismatch(prefix, e, what, checkpoint) from None
    _log("read %s: the model's variables (its optimizer state is not needed here)", prefix)


def _trainer(experiment: Experiment, model_dir: str, role: str) -> Any:
    trainer = experiment.trainer_cls()
    trainer.context = TaskContext(
        model_dir=model_dir, task_type=role, strategy=experiment.strategy_config.name
    )
    return trainer


def evaluate_checkpoint(
    experiment: Experiment, model_dir: str, checkpoint: str | None = None
) -> dict[str, float]:
    """Evaluates one checkpoint once; logs it, appends an ``eval`` record to metrics.jsonl."""
    trainer = _trainer(experiment, model_dir, "chief")
    global_step, _ = build_state(trainer, tf.distribute.get_strategy(), with_optimizer=False)
    state = ema.checkpoint_for_reading(trainer, global_step)
    eval_loop = loops.EvalLoop(trainer, None, distributed=False)
    if not eval_loop.enabled:
        raise ConfigError(
            f"{type(trainer).__name__}.build_eval_dataset returned None; there is nothing to "
            f"evaluate on."
        )
    prefix = checkpoint_to_read(model_dir, checkpoint)
    read_checked(state, prefix, f"{type(trainer).__name__}'s model")
    with ema.averaged_weights(trainer):
        metrics = eval_loop.evaluate()
    return report_eval(
        metrics,
        step=int(global_step.numpy()),
        tags=trainer_tags(trainer),
        record=MetricsRecord(storage.join(model_dir, "metrics.jsonl")),
        summaries=Summaries(model_dir, enabled=True),
        log=_log,
        checkpoint=prefix,
        evaluated_by=EVALUATED_BY,
    )


def restore_model(experiment: Experiment, model_dir: str, checkpoint: str | None = None) -> Any:
    """The Trainer's model, built on this process's one device with one checkpoint's weights
    (the optimizer's averages where it keeps them, as evaluation and export use).

    A checkpoint of any strategy and shard count restores: a sharded table's checkpoint
    holds the whole logical table, and a dynamic table's holds its keys, re-hashed onto this
    model's shards (its lookups are the cluster's).
    """
    trainer = _trainer(experiment, model_dir, "chief")
    trainer.model = build_model(trainer)
    prefix = checkpoint_to_read(model_dir, checkpoint)
    state = ema.checkpoint_for_reading(trainer)
    read_checked(state, prefix, f"{type(trainer).__name__}'s model")
    for variable, average in ema.averages_of(trainer):
        variable.assign(average)
    return trainer.model


def export_checkpoint(
    experiment: Experiment,
    model_dir: str,
    checkpoint: str | None = None,
    export_dir: str | None = None,
) -> str:
    """Writes a SavedModel with its serving signature from one checkpoint; returns its path.

    The default path is ``model_dir/export/<checkpoint name>`` (e.g. ``export/ckpt-400``).
    """
    trainer = _trainer(experiment, model_dir, "chief")
    trainer.model = build_model(trainer)
    prefix = checkpoint_to_read(model_dir, checkpoint)
    state = ema.checkpoint_for_reading(trainer)
    read_checked(state, prefix, f"{type(trainer).__name__}'s model")
    path = export_dir or storage.join(model_dir, "export", prefix.rstrip("/").rsplit("/", 1)[-1])
    try:
        with ema.averaged_weights(trainer):
            export.export_serving_model(trainer.model, path)
    except (ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0][:200]
        raise ConfigError(
            f"{type(trainer).__name__}'s model cannot be exported with a serving signature "
            f"({type(e).__name__}: {first}); build it on keras.Input (a functional or Sequential "
            f"model) or call it once on data before export."
        ) from None
    return path


def _log(fmt: str, *args: Any) -> None:
    from absl import logging

    logging.info(fmt, *args)
