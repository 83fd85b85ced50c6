"""The job's gin settings, ``train.*``: what to train, under which strategy, for how long.

Importing this module starts no TensorFlow: the CLI and the launcher load
the configuration and validate the cluster before TF starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gin

from tfdist_trainer import checks
from tfdist_trainer import hooks as hooks_lib
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan import warm_start as warm_start_lib
from tfdist_trainer.plan.strategies import OneDevice, StrategyConfig, as_strategy_config


@gin.configurable("train")
class Experiment:
    """Job-level settings (gin: ``train.trainer_cls = @MyTrainer``, ``train.strategy = @mirrored``...).

    Args:
      trainer_cls: the user's Trainer subclass.
      strategy: a strategy by its gin name, e.g. @mirrored (one of `plan/strategies/registry.NAMES`).
      train_steps: the global step at which training stops (exact under every strategy).
      steps_per_loop: steps per `tf.function` call (or per scheduled closure); None takes the
        strategy's default; 'auto' tunes it from measured throughput (up to the distance between
        hook boundaries such as log_every_n_steps, and settling within half of train_steps).
      log_every_n_steps: progress, train-metric records and summaries.
      eval_every_n_steps: the evaluation interval; None evaluates only at the end. Without an
        evaluator task the chief evaluates inline at these steps; with one, the chief saves a
        checkpoint at each of them instead, and the evaluator evaluates every checkpoint.
      checkpoint_every_n_steps: None saves only at the end (see CheckpointHook for time-based saves).
      keep_checkpoints: how many checkpoints to keep (besides one an evaluator is reading).
      async_checkpoint: a save copies the small state (step counter, dense weights, optimizer
        state outside the tables) and training goes on while a thread writes it; the thread
        reads the tables a shard (or 64 MiB chunk) at a time, each on the task that holds it,
        so a ps holds at most one shard besides its tables. A checkpoint then holds the small
        state of its step and each table shard as the write read it, moments later
        (`Checkpointer.save`). None: on wherever a save involves one task only (not where every
        worker takes part in a save: multi_worker_mirrored or model_parallel across workers);
        True there is refused.
      extra_hooks: more hooks after the default ones, e.g. [@EarlyStopping(), @ExportSavedModel()].
      seed: seeds Python, NumPy and TF for reproducible runs; None leaves them random.
      jit_compile: compile each replica's train step with XLA.
      mixed_precision: None, 'mixed_bfloat16' or 'mixed_float16' (the latter with dynamic loss
        scaling: the optimizer is wrapped in keras.optimizers.LossScaleOptimizer).
      warm_start: None, or @WarmStart(): a fresh model_dir starts from another run's weights
        (see tfdist_trainer/plan/warm_start.py).
      whole_table_warning_mib: a variable of at least this many MiB that sits whole on one ps,
        or that the training step reads whole to look rows up (a plain Keras Embedding under a
        distributed strategy), gets one warning naming it and the fix; None: no warning.
      gradient_accumulation_steps: k > 1 sums the gradients of k consecutive batches of each
        replica into one optimizer update (the update of one batch k times larger; one
        all-reduce per update); a step, and train_steps, count updates.
    """

    def __init__(
        self,
        *,
        trainer_cls: type | None = None,
        strategy: Any = OneDevice,
        train_steps: int = 1000,
        steps_per_loop: int | str | None = None,
        log_every_n_steps: int = 100,
        eval_every_n_steps: int | None = None,
        checkpoint_every_n_steps: int | None = 1000,
        keep_checkpoints: int = 3,
        async_checkpoint: bool | None = None,
        extra_hooks: Sequence[Any] = (),
        seed: int | None = None,
        jit_compile: bool = False,
        mixed_precision: str | None = None,
        warm_start: Any = None,
        gradient_accumulation_steps: int = 1,
        profile_steps: Sequence[int] | None = None,
        whole_table_warning_mib: float | None = 64,
    ):
        if trainer_cls is None:
            raise ConfigError(
                "train.trainer_cls is not set; bind it in gin, e.g. train.trainer_cls = @MyTrainer."
            )
        if not (isinstance(trainer_cls, type) and _is_trainer(trainer_cls)):
            raise ConfigError(
                f"train.trainer_cls must be a subclass of tfdist_trainer.Trainer, got {trainer_cls!r}."
            )
        for name, value in (
            ("train_steps", train_steps),
            ("log_every_n_steps", log_every_n_steps),
            ("keep_checkpoints", keep_checkpoints),
            ("gradient_accumulation_steps", gradient_accumulation_steps),
        ):
            checks.positive_int(f"train.{name}", value)
        if mixed_precision not in (None, "mixed_bfloat16", "mixed_float16"):
            raise ConfigError(
                f"train.mixed_precision must be None, 'mixed_bfloat16' or 'mixed_float16', "
                f"got {mixed_precision!r}."
            )
        if steps_per_loop == "auto":
            steps_per_loop_value = None
        elif isinstance(steps_per_loop, str):
            raise ConfigError(
                f"train.steps_per_loop must be a positive integer, 'auto' or None, got {steps_per_loop!r}."
            )
        else:
            steps_per_loop_value = steps_per_loop
        for name, value in (
            ("steps_per_loop", steps_per_loop_value),
            ("eval_every_n_steps", eval_every_n_steps),
            ("checkpoint_every_n_steps", checkpoint_every_n_steps),
        ):
            checks.positive_int(f"train.{name}", value, or_none=True)
        self.trainer_cls = trainer_cls
        self.strategy_config: StrategyConfig = as_strategy_config(strategy)
        self.strategy_config.check_job(gradient_accumulation_steps=gradient_accumulation_steps)
        self.train_steps = train_steps
        self.auto_steps_per_loop = steps_per_loop == "auto"
        self.steps_per_loop = steps_per_loop_value or self.strategy_config.default_steps_per_loop
        self.jit_compile = jit_compile
        self.mixed_precision = mixed_precision
        self.keep_checkpoints = keep_checkpoints
        if async_checkpoint is not None and not isinstance(async_checkpoint, bool):
            raise ConfigError(
                f"train.async_checkpoint must be True, False or None (on where it is safe), "
                f"got {async_checkpoint!r}."
            )
        self.async_checkpoint = async_checkpoint
        self.log_every_n_steps = log_every_n_steps
        self.eval_every_n_steps = eval_every_n_steps
        self.checkpoint_every_n_steps = checkpoint_every_n_steps
        self.hooks = hooks_lib.default_hooks(
            log_every_n_steps=log_every_n_steps,
            checkpoint_every_n_steps=checkpoint_every_n_steps,
            eval_every_n_steps=eval_every_n_steps,
        ) + hooks_lib.as_hooks(extra_hooks)
        if profile_steps is not None:
            self.hooks.append(hooks_lib.Profiler(*_profile_range(profile_steps, train_steps)))
        if whole_table_warning_mib is not None and not (
            isinstance(whole_table_warning_mib, (int, float))
            and not isinstance(whole_table_warning_mib, bool)
            and whole_table_warning_mib > 0
        ):
            raise ConfigError(
                f"train.whole_table_warning_mib must be a positive number of MiB or None, got "
                f"{whole_table_warning_mib!r}."
            )
        self.whole_table_warning_bytes = (
            None if whole_table_warning_mib is None else int(whole_table_warning_mib * 2**20)
        )
        self.seed = seed
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.warm_start = warm_start_lib.as_warm_start(warm_start)


def _profile_range(value: Any, train_steps: int) -> tuple[int, int]:
    """(first, last) of train.profile_steps, checked against train.train_steps."""
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(checks.is_positive_int(v) for v in value)
        and value[0] <= value[1] <= train_steps
    ):
        return int(value[0]), int(value[1])
    raise ConfigError(
        f"train.profile_steps must be (first, last) with 1 <= first <= last <= "
        f"train.train_steps={train_steps}, got {value!r}."
    )


def _is_trainer(cls: type) -> bool:
    """issubclass(cls, Trainer) without importing TensorFlow for a class that cannot be one.

    A Trainer subclass comes from a module that imported tfdist_trainer.trainers.trainer
    already; anything else is not a Trainer, whatever it is.
    """
    import sys

    trainer_module = sys.modules.get("tfdist_trainer.trainers.trainer")
    return trainer_module is not None and issubclass(cls, trainer_module.Trainer)
