"""Warm start: a fresh run begins from another run's weights (what Estimator's warm_start_from did).

In gin::

    train.warm_start = @WarmStart()
    WarmStart.checkpoint = '/runs/pretrain'   # a model_dir, a checkpoint prefix, or a Keras .weights.h5
    WarmStart.vars_regex = 'encoder/.*'       # which variables; the others start fresh

A variable is known by its Keras 3 `.path` without the model's own name:
``dense/kernel`` for ``sequential/dense/kernel``. Name your layers
(``Dense(10, name="head")``) for names that do not depend on how many layers
of a kind a process built before. `vars_regex` is matched from the start of a
name (`re.match`, as Estimator did).

- From one of our checkpoints (a model_dir's latest, or a ``.../ckpt-N``
  prefix), each selected variable is read by its saved name, so the model may
  differ from the one that wrote it (a new head, an extra layer): only the
  selected variables must be in the checkpoint, with the same shape.
- From a Keras ``.weights.h5`` (`model.save_weights`), Keras names weights by
  layer position, not by name, so the file must come from the same
  architecture; `vars_regex` still chooses which variables are taken from it.

Selected variables are assigned under the strategy's scope (onto the ps tasks
under parameter_server, to every replica under mirrored strategies); every
other variable keeps its fresh initial value, and so do the optimizer's state
and the global step (which starts at 0). The chief logs a table of what was
warm-started and what was not, and writes it to ``<model_dir>/warm_start.json``.

Warm start happens only on a fresh model_dir: once model_dir holds a
checkpoint, the run resumes from it and says that warm start was skipped.
Sharded tables (`ShardedEmbedding`, `ShardedSoftmax`) are saved as one logical
tensor per table, not per shard, and are not warm-started by name.

Importing this module starts no TensorFlow (gin registers `WarmStart` before TF starts).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gin
from absl import logging

from tfdist_trainer import storage
from tfdist_trainer.errors import ConfigError

#: The file in model_dir that records what a warm start took, and from where.
REPORT_FILE = "warm_start.json"


@gin.configurable
class WarmStart:
    """Where a fresh run takes its first weights from, and which ones.

    Args:
      checkpoint: a model_dir of ours (its latest checkpoint), a checkpoint prefix
        (``.../ckpt-1000``), or a Keras ``.weights.h5`` file; any path tf.io.gfile reads.
      vars_regex: the variables to warm-start, matched from the start of each name
        (``dense/kernel``); the default takes every model variable.
    """

    def __init__(self, checkpoint: str | None = None, vars_regex: str = ".*"):
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ConfigError(
                f"WarmStart.checkpoint must name a model_dir, a checkpoint prefix or a Keras "
                f".weights.h5 file, got {checkpoint!r}."
            )
        if not isinstance(vars_regex, str):
            raise ConfigError(
                f"WarmStart.vars_regex must be a regular expression string, got {vars_regex!r}."
            )
        try:
            self.pattern = re.compile(vars_regex)
        except re.error as e:
            raise ConfigError(
                f"WarmStart.vars_regex={vars_regex!r} is not a regular expression ({e})."
            ) from None
        self.checkpoint = checkpoint
        self.vars_regex = vars_regex

    @property
    def is_keras_weights(self) -> bool:
        return self.checkpoint.endswith(".h5")

    def apply(
        self,
        model: Any,
        *,
        build_copy: Callable[[], Any],
        scope: Callable[[], Any] | None = None,
    ) -> dict[str, Any]:
        """Assigns the selected variables of `model`; returns the report (what came from where).

        `build_copy` builds an unplaced copy of the model (a Keras .weights.h5 is
        loaded into it); `scope` is the strategy's scope, entered for the assignments.
        """
        import contextlib

        import numpy as np
        import tensorflow as tf

        variables = list(model.variables)
        names = relative_names([v.path for v in variables])
        selected = [i for i, name in enumerate(names) if self.pattern.match(name)]
        if not selected:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise ConfigError(
                f"WarmStart.vars_regex={self.vars_regex!r} matches none of the model's variables "
                f"({shown}); fix it (it is matched from the start of each name)."
            )
        if self.is_keras_weights:
            source, values = self._read_keras_weights(build_copy, len(variables), names, selected)
        else:
            source, values = self._read_checkpoint([names[i] for i in selected])
        for i in selected:
            want, got = tuple(variables[i].shape), tuple(np.shape(values[names[i]]))
            if want != got:
                raise ConfigError(
                    f"WarmStart: {names[i]} has shape {list(want)} in the model but {list(got)} "
                    f"in {source}; leave it out of WarmStart.vars_regex={self.vars_regex!r}."
                )
        with scope() if scope is not None else contextlib.nullcontext():
            for i in selected:
                variables[i].assign(tf.cast(values[names[i]], variables[i].dtype))
        chosen = set(selected)
        report = {
            "from": self.checkpoint,
            "checkpoint": source,
            "vars_regex": self.vars_regex,
            "warm_started": [names[i] for i in selected],
            "fresh": [name for i, name in enumerate(names) if i not in chosen],
        }
        logging.info(
            "warm start from %s (vars_regex %r): %d of %d variables warm-started; the rest, the "
            "optimizer state and the global step start fresh\n%s",
            source,
            self.vars_regex,
            len(selected),
            len(variables),
            _table(variables, names, chosen),
        )
        return report

    def _read_checkpoint(self, wanted: list[str]) -> tuple[str, dict[str, Any]]:
        import tensorflow as tf

        from tfdist_trainer import tf_compat

        prefix = self.checkpoint
        try:
            if storage.isdir(prefix):
                prefix = tf.train.latest_checkpoint(self.checkpoint)
                if prefix is None:
                    raise ConfigError(
                        f"WarmStart.checkpoint={self.checkpoint!r} is a directory without a "
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
                f"WarmStart.checkpoint={self.checkpoint!r} is not a model_dir, a checkpoint prefix "
                f"or a Keras .weights.h5 file ({message})."
            ) from None
        keys = list(saved_names)
        by_name = dict(zip(relative_names([saved_names[k] for k in keys]), keys))
        missing = [name for name in wanted if name not in by_name]
        if missing:
            shown = ", ".join(sorted(by_name)[:8]) + (", ..." if len(by_name) > 8 else "")
            raise ConfigError(
                f"WarmStart: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                f"(matched by vars_regex={self.vars_regex!r}) not in {prefix}, which holds "
                f"{shown or 'no model variables'}; narrow WarmStart.vars_regex."
            )
        return prefix, {name: reader.get_tensor(by_name[name]) for name in wanted}

    def _read_keras_weights(
        self, build_copy: Callable[[], Any], count: int, names: list[str], selected: list[int]
    ) -> tuple[str, dict[str, Any]]:
        if not storage.exists(self.checkpoint):
            raise ConfigError(
                f"WarmStart.checkpoint={self.checkpoint!r} does not exist; name a Keras "
                f".weights.h5 file, a model_dir or a checkpoint prefix."
            )
        import tensorflow as tf

        copy = build_copy()
        try:
            copy.load_weights(self.checkpoint)
        except (ValueError, OSError, KeyError, TypeError, tf.errors.OpError) as e:
            text = (getattr(e, "message", None) or str(e)).strip()
            message = text.splitlines()[0] if text else type(e).__name__
            raise ConfigError(
                f"WarmStart.checkpoint={self.checkpoint!r} does not fit the Trainer's model "
                f"({message}); a Keras .weights.h5 must come from the same architecture (use one "
                f"of our checkpoints to warm-start part of a different model)."
            ) from None
        weights = [v.numpy() for v in copy.variables]
        if len(weights) != count:
            raise ConfigError(
                f"WarmStart.checkpoint={self.checkpoint!r} loaded into a model with {len(weights)} "
                f"variables, but the Trainer's model has {count}; build_model must build the "
                f"same model each time."
            )
        return self.checkpoint, {names[i]: weights[i] for i in selected}


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
    rows = [("variable", "shape", "start")] + [
        (
            name,
            str(list(variable.shape)),
            "warm-started" if i in chosen else "fresh (not matched by vars_regex)",
        )
        for i, (name, variable) in enumerate(zip(names, variables))
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(2)]
    return "\n".join(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows)


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
    from tfdist_trainer.state import build_model

    report = warm_start.apply(trainer.model, build_copy=lambda: build_model(trainer), scope=scope)
    if is_chief:
        storage.write_json(storage.join(model_dir, REPORT_FILE), report)


def as_warm_start(value: Any) -> WarmStart | None:
    """train.warm_start: None or @WarmStart() (a bare @WarmStart is called)."""
    if isinstance(value, type) and issubclass(value, WarmStart):
        value = value()
    if value is not None and not isinstance(value, WarmStart):
        raise ConfigError(f"train.warm_start must be @WarmStart() or None, got {value!r}.")
    return value
