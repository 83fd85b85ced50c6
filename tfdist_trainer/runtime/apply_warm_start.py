"""Warm start at run time: assign the variables `train.warm_start` (a `WarmStart`) selects.

`tfdist_trainer.plan.warm_start` says what a warm start is (its gin settings,
checked before TensorFlow starts); this module reads the weights and assigns
them. See the settings module for what a user writes and what happens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.io import storage
from tfdist_trainer.plan.warm_start import WarmStart
from tfdist_trainer.runtime.state import build_model
from tfdist_trainer.tables import format_table

#: The file in model_dir that records what a warm start took, and from where.
REPORT_FILE = "warm_start.json"


def apply(
    settings: WarmStart,
    model: Any,
    *,
    build_copy: Callable[[], Any],
    scope: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Assigns the selected variables of `model`; returns the report (what came from where).

    `build_copy` builds an unplaced copy of the model (a Keras .weights.h5 is
    loaded into it); `scope` is the strategy's scope, entered for the assignments.
    """

    variables = list(model.variables)
    names = relative_names([v.path for v in variables])
    selected = [i for i, name in enumerate(names) if settings.pattern.match(name)]
    if not selected:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ConfigError(
            f"WarmStart.vars_regex={settings.vars_regex!r} matches none of the model's variables "
            f"({shown}); fix it (it is matched from the start of each name)."
        )
    if settings.is_keras_weights:
        source, values = _read_keras_weights(settings, build_copy, len(variables), names, selected)
    else:
        source, values = _read_checkpoint(settings, [names[i] for i in selected])
    for i in selected:
        want, got = tuple(variables[i].shape), tuple(np.shape(values[names[i]]))
        if want != got:
            raise ConfigError(
                f"WarmStart: {names[i]} has shape {list(want)} in the model but {list(got)} "
                f"in {source}; leave it out of WarmStart.vars_regex={settings.vars_regex!r}."
            )
    with scope() if scope is not None else contextlib.nullcontext():
        for i in selected:
            variables[i].assign(tf.cast(values[names[i]], variables[i].dtype))
    chosen = set(selected)
    report = {
        "from": settings.checkpoint,
        "checkpoint": source,
        "vars_regex": settings.vars_regex,
        "warm_started": [names[i] for i in selected],
        "fresh": [name for i, name in enumerate(names) if i not in chosen],
    }
    logging.info(
        "warm start from %s (vars_regex %r): %d of %d variables warm-started; the rest, the "
        "optimizer state and the global step start fresh\n%s",
        source,
        settings.vars_regex,
        len(selected),
        len(variables),
        _table(variables, names, chosen),
    )
    return report


def _read_checkpoint(settings: WarmStart, wanted: list[str]) -> tuple[str, dict[str, Any]]:
    prefix = settings.checkpoint
    try:
        if storage.isdir(prefix):
            prefix = tf.train.latest_checkpoint(settings.checkpoint)
            if prefix is None:
                raise ConfigError(
                    f"WarmStart.checkpoint={settings.checkpoint!r} is a directory without a "
                    f"checkpoint; name a model_dir that holds one, or a checkpoint prefix."
                )
        # The model's variables: those under the checkpoint's `model` child (the Checkpointer's layout).
        saved_names = tf_compat.checkpoint_variable_names(prefix, child="model")
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError, OSError) as e:
        if isinstance(e, ConfigError):
            raise
        message = (getattr(e, "message", None) or str(e)).strip().splitlines()[0]
        raise ConfigError(
            f"WarmStart.checkpoint={settings.checkpoint!r} is not a model_dir, a checkpoint prefix "
            f"or a Keras .weights.h5 file ({message})."
        ) from None
    keys = list(saved_names)
    by_name = dict(zip(relative_names([saved_names[k] for k in keys]), keys))
    missing = [name for name in wanted if name not in by_name]
    if missing:
        shown = ", ".join(sorted(by_name)[:8]) + (", ..." if len(by_name) > 8 else "")
        raise ConfigError(
            f"WarmStart: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
            f"(matched by vars_regex={settings.vars_regex!r}) not in {prefix}, which holds "
            f"{shown or 'no model variables'}; narrow WarmStart.vars_regex."
        )
    return prefix, {name: reader.get_tensor(by_name[name]) for name in wanted}


def _read_keras_weights(
    settings: WarmStart,
    build_copy: Callable[[], Any],
    count: int,
    names: list[str],
    selected: list[int],
) -> tuple[str, dict[str, Any]]:
    if not storage.exists(settings.checkpoint):
        raise ConfigError(
            f"WarmStart.checkpoint={settings.checkpoint!r} does not exist; name a Keras "
            f".weights.h5 file, a model_dir or a checkpoint prefix."
        )
    copy = build_copy()
    try:
        copy.load_weights(settings.checkpoint)
    except (ValueError, OSError, KeyError, TypeError, tf.errors.OpError) as e:
        text = (getattr(e, "message", None) or str(e)).strip()
        message = text.splitlines()[0] if text else type(e).__name__
        raise ConfigError(
            f"WarmStart.checkpoint={settings.checkpoint!r} does not fit the Trainer's model "
            f"({message}); a Keras .weights.h5 must come from the same architecture (use one "
            f"of our checkpoints to warm-start part of a different model)."
        ) from None
    weights = [v.numpy() for v in copy.variables]
    if len(weights) != count:
        raise ConfigError(
            f"WarmStart.checkpoint={settings.checkpoint!r} loaded into a model with {len(weights)} "
            f"variables, but the Trainer's model has {count}; build_model must build the "
            f"same model each time."
        )
    return settings.checkpoint, {names[i]: weights[i] for i in selected}


def relative_names(paths: list[str]) -> list[str]:
    """Variable paths without the model's own name: the first component most paths share.

    ``sequential/dense/kernel`` and ``sequential_3/dense/kernel`` (the same
    model, built after another one in the process) both become
    ``dense/kernel``. The same rule runs on the model and on the checkpoint,
    so a name that lacks the common first component (a variable created
    outside the model's scope) is kept whole on both sides.
    """
    firsts = [path.split("/", 1)[0] for path in paths if "/" in path]
    if not firsts:
        return list(paths)
    common = max(set(firsts), key=firsts.count)
    if firsts.count(common) * 2 <= len(paths):
        return list(paths)
    return [path.removeprefix(common + "/") for path in paths]


def _table(variables: list[Any], names: list[str], chosen: set[int]) -> str:
    rows = [
        (
            name,
            str(list(variable.shape)),
            "warm-started" if i in chosen else "fresh (not matched by vars_regex)",
        )
        for i, (name, variable) in enumerate(zip(names, variables))
    ]
    return format_table(("variable", "shape", "start"), rows, left=(0, 1, 2), indent="  ")


def warm_start_or_resume(
    warm_start: WarmStart | None,
    trainer: Any,
    *,
    restored_step: int | None,
    model_dir: str,
    is_chief: bool,
    scope: Callable[[], Any] | None = None,
) -> None:
    """After the Checkpointer's restore: warm-starts a fresh run, or says why it did not."""
    if warm_start is None:
        return
    if restored_step is not None:
        logging.info(
            "model_dir %s holds a checkpoint (step %d): resuming from it; warm start from %s skipped",
            model_dir,
            restored_step,
            warm_start.checkpoint,
        )
        return
    report = apply(warm_start, trainer.model, build_copy=lambda: build_model(trainer), scope=scope)
    if is_chief:
        storage.write_json(storage.join(model_dir, REPORT_FILE), report)
