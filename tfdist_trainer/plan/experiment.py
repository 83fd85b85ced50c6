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
from tfdist_trainer.plan import options
from tfdist_trainer.plan import warm_start as warm_start_lib
from tfdist_trainer.plan.strategies import OneDevice, StrategyConfig, as_strategy_config


@gin.configurable("train")
class Experiment:
    """Job-level settings (gin: ``train.trainer_cls = @MyTrainer``, ``train.strategy = @mirrored``...).

    Held as frozen groups (plan/options.py), each handed whole to the code that uses it:
    ``loop`` (`LoopOptions`), ``checkpoints``, ``evaluation``, ``logging``; beside them the
    ``trainer_cls``, the ``strategy_config``, the ``hooks`` and the ``warm_start``.

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
        _check_trainer_cls(trainer_cls)
        self.trainer_cls = trainer_cls
        self.strategy_config: StrategyConfig = as_strategy_config(strategy)
        fixed_steps_per_loop, auto = options.steps_per_loop_setting(steps_per_loop)
        self.evaluation = options.EvaluationOptions(every_n_steps=eval_every_n_steps)
        self.checkpoints = options.CheckpointOptions(
            every_n_steps=checkpoint_every_n_steps,
            keep=keep_checkpoints,
            background=async_checkpoint,
        )
        checks.positive_int("train.train_steps", train_steps)
        self.logging = options.LoggingOptions(
            every_n_steps=log_every_n_steps,
            profile_steps=options.profile_range(profile_steps, train_steps),
            whole_table_warning_bytes=options.whole_table_warning_bytes(whole_table_warning_mib),
        )
        self.loop = options.LoopOptions(
            train_steps=train_steps,
            steps_per_loop=fixed_steps_per_loop or self.strategy_config.default_steps_per_loop,
            auto_steps_per_loop=auto,
            hook_spacing=self._hook_spacing(),
            gradient_accumulation_steps=gradient_accumulation_steps,
            jit_compile=jit_compile,
            mixed_precision=mixed_precision,
            seed=seed,
        )
        self.strategy_config.check_job(gradient_accumulation_steps=gradient_accumulation_steps)
        self.hooks = self._hooks(extra_hooks)
        self.warm_start = warm_start_lib.as_warm_start(warm_start)

    def _hook_spacing(self) -> int:
        """The shortest interval at which the default hooks end loops (log, eval, checkpoint)."""
        every = (
            self.logging.every_n_steps,
            self.evaluation.every_n_steps,
            self.checkpoints.every_n_steps,
        )
        return min(n for n in every if n)

    def _hooks(self, extra_hooks: Sequence[Any]) -> list:
        """The default hooks at the groups' intervals, the user's, and the profiler if asked."""
        hooks = hooks_lib.default_hooks(
            log_every_n_steps=self.logging.every_n_steps,
            checkpoint_every_n_steps=self.checkpoints.every_n_steps,
            eval_every_n_steps=self.evaluation.every_n_steps,
        ) + hooks_lib.as_hooks(extra_hooks)
        if self.logging.profile_steps is not None:
            hooks.append(hooks_lib.Profiler(*self.logging.profile_steps))
        return hooks


def _check_trainer_cls(trainer_cls: Any) -> None:
    """One sentence unless train.trainer_cls is a Trainer subclass."""
    if trainer_cls is None:
        raise ConfigError(
            "train.trainer_cls is not set; bind it in gin, e.g. train.trainer_cls = @MyTrainer."
        )
    if not (isinstance(trainer_cls, type) and _is_trainer(trainer_cls)):
        raise ConfigError(
            f"train.trainer_cls must be a subclass of tfdist_trainer.Trainer, got {trainer_cls!r}."
        )


def _is_trainer(cls: type) -> bool:
    """issubclass(cls, Trainer) without importing TensorFlow for a class that cannot be one.

    A Trainer subclass comes from a module that imported tfdist_trainer.trainers.trainer
    already; anything else is not a Trainer, whatever it is.
    """
    import sys

    trainer_module = sys.modules.get("tfdist_trainer.trainers.trainer")
    return trainer_module is not None and issubclass(cls, trainer_module.Trainer)
