"""What every self-sharding layer shares: its sharded weights, checkpointed as logical tables, not shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.placement import ps_devices


def resolve_num_shards(
    layer_name: str, vocab: int, num_shards: int | None, devices: Sequence[str] | None
) -> int:
    if num_shards is None:  # one per device (ps task), but never more than there are rows
        num_shards = min(vocab, len(devices) if devices else max(1, len(ps_devices())))
    if not isinstance(num_shards, (int, np.integer)) or num_shards < 1:
        raise ConfigError(
            f"{layer_name}: num_shards must be a positive integer, got {num_shards!r}."
        )
    if num_shards > vocab:
        raise ConfigError(
            f"{layer_name}: num_shards={num_shards} is larger than the table's {vocab} rows; "
            f"use at most {vocab} shards (every shard needs at least one row)."
        )
    return int(num_shards)


class ShardedLayerMixin(tf_compat.ReplacesCheckpointChildren):
    """Checkpoints the layer's sharded weights as logical tables instead of shards."""

    def sharded_weights(self) -> list[ShardedWeight]:
        return [w for w in self.__dict__.get("_tfdist_sharded", ()) if w is not None]

    def _add_sharded(self, sharded: ShardedWeight, child_name: str) -> None:
        self.__dict__.setdefault("_tfdist_sharded", []).append(sharded)
        self.__dict__.setdefault("_tfdist_children", {})[child_name] = sharded.checkpoint

    def checkpoint_children(self, children: dict[str, Any]) -> dict[str, Any]:
        shards = {id(v) for w in self.sharded_weights() for v in w.variables}
        children = {name: child for name, child in children.items() if id(child) not in shards}
        children.update(self.__dict__.get("_tfdist_children", {}))
        return children

    @property
    def shards(self) -> list:
        """The shard variables (Keras variables) of every sharded table of this layer."""
        return [v for w in self.sharded_weights() for v in w.variables]


def sharded_layers(model: keras.layers.Layer) -> list:
    """The self-sharding layers in `model` (itself included), depth-first."""
    return [
        layer
        for layer in tf_compat.sublayers(model, include_self=True)
        if isinstance(layer, ShardedLayerMixin)
    ]
