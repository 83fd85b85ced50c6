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

The settings only: gin registers `WarmStart` before TF starts, and a bad setting is an error
then. `tfdist_trainer.runtime.apply_warm_start` applies them.
"""

from __future__ import annotations

import re
from typing import Any

import gin

from tfdist_trainer.errors import ConfigError


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


def as_warm_start(value: Any) -> WarmStart | None:
    """train.warm_start: None or @WarmStart() (a bare @WarmStart is called)."""
    if isinstance(value, type) and issubclass(value, WarmStart):
        value = value()
    if value is not None and not isinstance(value, WarmStart):
        raise ConfigError(f"train.warm_start must be @WarmStart() or None, got {value!r}.")
    return value
