"""The one way a SavedModel is exported: a serving signature over the model's call.

Two callers, one path: the training chief exports a copy of the model rebuilt
outside any strategy from the latest checkpoint (its live model is distributed:
sharded tables, variables on ps tasks), the evaluator side-car exports the
model it evaluated (built outside any distributed strategy already).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.runtime.state import build_model


def export_serving_model(model: Any, path: str) -> None:
    """Writes `model` to `path` as a SavedModel whose `serve` signature (also ``serving_default``)
    runs its call; each weight is saved once (`tf_compat.export_archive_of`)."""
    tf_compat.export_archive_of(model).write_out(path, verbose=False)
    logging.info("exported a SavedModel with a serving signature to %s", path)


def export_from_checkpoint(
    trainer: Any, checkpoint: str, path: str, *, averages: list | None = None
) -> None:
    """Exports a copy of the trainer's model, built outside any strategy, with `checkpoint`'s weights.

    The copy reads the checkpoint rather than `get_weights()`: sharded tables
    re-shard on restore, so the copy need not match the cluster's layout.
    `averages` (the optimizer's EMA of the trainable variables, in their order)
    replace the copy's trainable weights when they line up with them.
    """
    local = build_model(trainer)
    tf.train.Checkpoint(model=local).read(checkpoint).expect_partial()
    if averages:
        targets = local.trainable_variables
        if len(targets) == len(averages) and all(
            tuple(t.shape) == tuple(a.shape) for t, a in zip(targets, averages)
        ):
            for target, average in zip(targets, averages):
                target.assign(tf.convert_to_tensor(average))
        else:
            logging.warning(
                "exporting the raw weights: the export copy's %d trainable variables do not line "
                "up with the optimizer's %d moving averages (a re-sharded table?)",
                len(targets),
                len(averages),
            )
    export_serving_model(local, path)
