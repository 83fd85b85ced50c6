"""The job's ``train.*`` settings as frozen groups, each handed whole to the code that uses it.

Why groups (Orbit's `StandardTrainerOptions` shape): a flat bag of 17 knobs passed
everywhere made every consumer depend on all of them, and one knob crossed eight
files under three names. Each group is checked when it is made (one sentence per
mistake, before TensorFlow starts) and read by the few modules that act on it:

- `LoopOptions`: how the training loop runs (`StrategyRuntime.make_train_loop`, the
  controller's target, the devices' precision and seeds);
- `CheckpointOptions`: when and how checkpoints are written and kept (the strategy
  runtime's writer, `CheckpointHook`);
- `EvaluationOptions`: when an evaluation is due (`EvalHook`, the evaluator task);
- `LoggingOptions`: progress records, the profiler and the whole-table warning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError

_PRECISIONS = (None, "mixed_bfloat16", "mixed_float16")


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How the training loop runs.

    `steps_per_loop` is resolved: the gin value, else the strategy's default; with
    `auto_steps_per_loop` it is the tuner's ceiling, and `hook_spacing` (the shortest
    interval at which a hook ends loops) bounds the search.
    """

    train_steps: int
    steps_per_loop: int
    auto_steps_per_loop: bool = False
    hook_spacing: int | None = None
    gradient_accumulation_steps: int = 1
    jit_compile: bool = False
    mixed_precision: str | None = None
    seed: int | None = None

    def __post_init__(self):
        for name in ("train_steps", "steps_per_loop", "gradient_accumulation_steps"):
            checks.positive_int(f"train.{name}", getattr(self, name))
        if self.mixed_precision not in _PRECISIONS:
            raise ConfigError(
                f"train.mixed_precision must be None, 'mixed_bfloat16' or 'mixed_float16', "
                f"got {self.mixed_precision!r}."
            )


@dataclasses.dataclass(frozen=True)
class CheckpointOptions:
    """When checkpoints are saved (`every_n_steps`; None: at the end only), how many are kept,
    and whether a save writes in the background (`background`: None, wherever it is safe)."""

    every_n_steps: int | None = 1000
    keep: int = 3
    background: bool | None = None

    def __post_init__(self):
        checks.positive_int("train.checkpoint_every_n_steps", self.every_n_steps, or_none=True)
        checks.positive_int("train.keep_checkpoints", self.keep)
        if self.background is not None and not isinstance(self.background, bool):
            raise ConfigError(
                f"train.async_checkpoint must be True, False or None (on where it is safe), "
                f"got {self.background!r}."
            )


@dataclasses.dataclass(frozen=True)
class EvaluationOptions:
    """When an evaluation is due (`every_n_steps`; None: at the end only)."""

    every_n_steps: int | None = None

    def __post_init__(self):
        checks.positive_int("train.eval_every_n_steps", self.every_n_steps, or_none=True)


@dataclasses.dataclass(frozen=True)
class LoggingOptions:
    """Progress records every `every_n_steps`; the profiled steps (first, last) or None; the
    size from which a table read whole gets a warning (bytes; None: no warning)."""

    every_n_steps: int = 100
    profile_steps: tuple[int, int] | None = None
    whole_table_warning_bytes: int | None = 64 * 2**20

    def __post_init__(self):
        checks.positive_int("train.log_every_n_steps", self.every_n_steps)


def steps_per_loop_setting(value: Any) -> tuple[int | None, bool]:
    """train.steps_per_loop as (a fixed size or None for the strategy's default, whether 'auto')."""
    if value == "auto":
        return None, True
    if isinstance(value, str):
        raise ConfigError(
            f"train.steps_per_loop must be a positive integer, 'auto' or None, got {value!r}."
        )
    checks.positive_int("train.steps_per_loop", value, or_none=True)
    return value, False


def whole_table_warning_bytes(mib: Any) -> int | None:
    """train.whole_table_warning_mib in bytes (None: no warning); anything else but a positive
    number of MiB is one sentence."""
    if mib is None:
        return None
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or mib <= 0:
        raise ConfigError(
            f"train.whole_table_warning_mib must be a positive number of MiB or None, got {mib!r}."
        )
    return int(mib * 2**20)


def profile_range(value: Any, train_steps: int) -> tuple[int, int] | None:
    """(first, last) of train.profile_steps, checked against train.train_steps; None: none."""
    if value is None:
        return None
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
