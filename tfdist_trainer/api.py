"""`tfdist_trainer.train(...)`: one training run in this Python process (a notebook, a script).

The same run as `tfdist-train` on a lone machine: the same gin files and
bindings (`train.*`, `Trainer.*`, the strategy's), checked by the same
preflight (`plan.preflight.prepare`: model_dir, gin, the strategy's topology), trained by
the same `run_training` (runtime/train/controller.py), with the same files under model_dir. Only
the strategies that run in one process are accepted (one_device, mirrored,
model_parallel without data_parallel); the others need one process per task,
which `tfdist-launch` (or `tfdist-train` on each task) starts.

Importing this module starts no TensorFlow.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from typing import Any


def train(
    trainer_cls: type | None = None,
    *,
    model_dir: str | os.PathLike,
    gin_files: Sequence[str] = (),
    gin_bindings: Sequence[str] = (),
    modules: Sequence[str] = (),
    log_level: str | None = "info",
) -> dict[str, Any]:
    """Trains in this process as configured in gin; returns the final step and metrics.

    Args:
      trainer_cls: the Trainer subclass to train; None takes gin's `train.trainer_cls`
        (e.g. `@KerasTrainer` with `KerasTrainer.model_fn` for a compiled model).
      model_dir: checkpoints, metrics.jsonl, summaries (a local path, gs://..., ram://...).
        A model_dir that holds a checkpoint resumes from it, as with the CLI.
      gin_files: gin files, later ones win (e.g. a recipe's, then configs/strategies/mirrored.gin).
      gin_bindings: bindings such as "train.train_steps=100", applied after the files.
      modules: modules to import before parsing gin (the CLI's --module).
      log_level: absl's verbosity for the run ("info" shows progress, "warning" only problems);
        None leaves it as it is.

    Returns:
      {"step": the final global step, the last train metrics ("loss", ...), the last
      evaluation ("eval_loss", "eval_accuracy", ...) when there was one}.

    Raises:
      ConfigError: a bad gin configuration or model_dir, a TF_CONFIG naming a cluster, or a
        strategy that needs several processes (multi_worker_mirrored, parameter_server,
        model_parallel with data_parallel). Errors of the run itself propagate as with the
        CLI (e.g. NonFiniteLossError); none of them exits the interpreter.

    The run's SIGTERM handler (save a checkpoint, then stop) and its mixed-precision policy
    are undone when it returns. Gin's configuration is global: each call clears it and
    parses its own files. TensorFlow's devices are fixed when it first starts in a process,
    so a notebook that trains under mirrored on logical CPUs must not have run another
    strategy first (restart the kernel).
    """
    from absl import logging

    if log_level is not None:
        logging.set_verbosity(log_level)
    prepared = _prepared("TRAIN_API", trainer_cls, model_dir, gin_files, gin_bindings, modules)
    prepared.create_model_dir()
    return _run_training_in_this_process(prepared)


def _run_training_in_this_process(prepared: Any) -> dict[str, Any]:
    """Runs the checked training, then puts back what it changes for the whole process (the
    mixed-precision policy, the SIGTERM handler): a notebook goes on after it."""
    import keras

    from tfdist_trainer.runtime.config_checks import config_checks_are_config_errors
    from tfdist_trainer.runtime.train.controller import run_training

    previous_policy = keras.mixed_precision.global_policy()
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with config_checks_are_config_errors():
            return run_training(prepared.experiment, prepared.cluster, prepared.model_dir)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_sigterm)


def evaluate(
    trainer_cls: type | None = None,
    *,
    model_dir: str | os.PathLike,
    checkpoint: str | None = None,
    gin_files: Sequence[str] = (),
    gin_bindings: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> dict[str, float]:
    """Evaluates one checkpoint once (`tfdist-train --mode=evaluate`); returns {eval_<name>: value}.

    `checkpoint` is a prefix (default: model_dir's newest). The evaluation is logged and
    appended to model_dir's metrics.jsonl. A model_dir with no checkpoint, or a checkpoint
    of another model, raises ConfigError.
    """
    prepared = _prepared("EVALUATE_API", trainer_cls, model_dir, gin_files, gin_bindings, modules)
    from tfdist_trainer.runtime import checkpoint_actions

    return checkpoint_actions.evaluate_checkpoint(
        prepared.experiment, prepared.model_dir, checkpoint
    )


def export(
    trainer_cls: type | None = None,
    *,
    model_dir: str | os.PathLike,
    checkpoint: str | None = None,
    export_dir: str | None = None,
    gin_files: Sequence[str] = (),
    gin_bindings: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> str:
    """Writes a SavedModel with its serving signature from one checkpoint (`--mode=export`).

    Returns its path (default: model_dir/export/<checkpoint name>).
    """
    prepared = _prepared("EXPORT_API", trainer_cls, model_dir, gin_files, gin_bindings, modules)
    from tfdist_trainer.runtime import checkpoint_actions

    return checkpoint_actions.export_checkpoint(
        prepared.experiment, prepared.model_dir, checkpoint, export_dir
    )


def load_model(
    trainer_cls: type | None = None,
    *,
    model_dir: str | os.PathLike,
    checkpoint: str | None = None,
    gin_files: Sequence[str] = (),
    gin_bindings: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> Any:
    """The trained Keras model back in Python: the Trainer's `build_model()` on one device, with
    one checkpoint's weights (default: model_dir's newest), for offline scoring and debugging.

    A checkpoint of any strategy restores: sharded tables are read whole, a DynamicEmbedding's
    keys are re-hashed onto this model's shards (same lookups as the cluster's). The optimizer's
    state is not read (an optimizer keeping moving averages: the averages, as for export).
    Call the model as `trainer_cls.build_model()`'s model is called (`model(features)`; a
    DynamicEmbedding reads without inserting unless called with training=True).
    """
    prepared = _prepared("EXPORT_API", trainer_cls, model_dir, gin_files, gin_bindings, modules)
    from tfdist_trainer.runtime import checkpoint_actions

    return checkpoint_actions.restore_model(prepared.experiment, prepared.model_dir, checkpoint)


def _prepared(
    entry_point: str,
    trainer_cls: type | None,
    model_dir: str | os.PathLike,
    gin_files: Sequence[str],
    gin_bindings: Sequence[str],
    modules: Sequence[str],
) -> Any:
    """The checked run of an API entry point (`preflight.<entry_point>`): gin, model_dir, trainer."""
    from tfdist_trainer.plan import preflight

    return preflight.prepare(
        getattr(preflight, entry_point),
        model_dir,
        gin_files,
        gin_bindings,
        modules,
        trainer_cls=trainer_cls,
    )
