"""Saying it when a large table is whole: placed whole on one ps, or read whole by every step.

A plain Keras `Embedding` (or keras-rs' `DistributedEmbedding` off TPU, one
plain `Embedding` per table) trains under every strategy, only slowly: under
parameter_server its table sits whole on one ps (that task holds and serves
it all), and under a distributed strategy its lookup reads the whole table at
every step (`GatherV2` of the table, not `ResourceGather` of the rows). Nothing
fails, so nothing would tell the user; these checks say it once, naming the
variable, its size and the fix. `train.whole_table_warning_mib` sets the size
from which a variable counts as a table (None: no warning).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer.sharding import runtime_api as tables
from tfdist_trainer.variables import format_bytes

FIX = (
    "build it as tfdist_trainer.sharding.ShardedEmbedding, or a keras-rs model's tables with "
    "tfdist_trainer.sharding.from_keras_rs(feature_configs), which split it by rows and read "
    "only the rows a batch needs (train.whole_table_warning_mib = None silences this)"
)


def is_shard(variable: Any) -> bool:
    """A shard of a self-sharding table (its bytes are already split)."""
    return getattr(variable, "_tfdist_table", None) is not None


def warn_whole_on_ps(records: list[dict[str, Any]], variables: list, min_bytes: int) -> None:
    """One warning per large variable placed whole on one ps task (`placement_records` rows)."""
    for record, variable in zip(records, variables):
        if is_shard(variable) or record["bytes"] < min_bytes or "/job:ps/" not in record["device"]:
            continue
        task = tf.DeviceSpec.from_string(record["device"]).task
        logging.warning(
            "%s (%s) sits whole on ps:%s: that one task holds and serves all of it, the others "
            "none; %s.",
            record["name"],
            format_bytes(record["bytes"]),
            task,
            FIX,
        )


def largest(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The placement record of the largest single variable, if any."""
    return max(records, key=lambda r: r["bytes"], default=None)


def warn_whole_reads(
    step_fn: Callable, trainer: Any, min_bytes: int, strategy_name: str
) -> Callable:
    """`step_fn`, which when first traced warns of each large variable its graph reads whole."""
    warned = False

    def step(*args, **kwargs):
        nonlocal warned
        result = step_fn(*args, **kwargs)
        if not warned and not tf.executing_eagerly():
            warned = True
            variables = [v for v in trainer.model.variables if not is_shard(v)]
            graph = tf.compat.v1.get_default_graph()
            for found in tables.whole_reads(graph, variables, min_bytes):
                logging.warning(
                    "%s (%s) is read whole at every step under %s to look up a few rows; %s.",
                    found["name"],
                    format_bytes(found["bytes"]),
                    strategy_name,
                    FIX,
                )
        return result

    return step
