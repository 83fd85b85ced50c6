"""`ShardedEmbedding`: an embedding table split by rows into ordinary variables, one gather per shard.

`EmbeddingGroup` looks several of them up in one call (one read per ps task).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.fixed.grouped_lookup import lookup_together
from tfdist_trainer.sharding.fixed.layer import ShardedLayerMixin, resolve_num_shards
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.layout import PARTITION_STRATEGIES, ShardLayout
from tfdist_trainer.sharding.saving import serializable


@serializable
class ShardedEmbedding(ShardedLayerMixin, keras.layers.Layer):
    """An embedding table of `input_dim` rows split by rows into `num_shards` variables.

    Args:
      input_dim: rows (vocabulary size).
      output_dim: embedding width.
      num_shards: shards; None: the number of ps tasks under parameter_server,
        len(devices) when devices are given, else 1. More shards than rows is an error.
      partition_strategy: "div" (contiguous ranges, TF2's embedding_lookup) or "mod".
      devices: for model parallelism outside parameter_server, the devices the
        shards are spread over (bytes-balanced). Under parameter_server, ps
        devices such as "/job:ps/task:1" restrict the choice.
      embeddings_initializer: Keras initializer of every shard.
      unique: gather each distinct id once per batch (fewer rows on the wire).
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        num_shards: int | None = None,
        partition_strategy: str = "div",
        devices: Sequence[str] | None = None,
        embeddings_initializer: Any = "uniform",
        unique: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if input_dim < 1 or output_dim < 1:
            raise ConfigError(
                f"{self.name}: input_dim and output_dim must be >= 1, got {input_dim} and {output_dim}."
            )
        if partition_strategy not in PARTITION_STRATEGIES:
            raise ConfigError(
                f"{self.name}: partition_strategy must be 'div' or 'mod', got {partition_strategy!r}."
            )
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.num_shards = num_shards
        self.partition_strategy = partition_strategy
        self.devices = list(devices) if devices else None
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.unique = unique
        if num_shards is not None:  # fail at construction, not deep inside build
            resolve_num_shards(self.name, self.input_dim, num_shards, self.devices)

    def build(self, input_shape=None):
        shards = resolve_num_shards(self.name, self.input_dim, self.num_shards, self.devices)
        sharded = ShardedWeight(
            self,
            "embeddings",
            ShardLayout(self.input_dim, shards, self.partition_strategy),
            self.output_dim,
            self.embeddings_initializer,
            self.devices,
            self.variable_dtype,
        )
        self._add_sharded(sharded, "table")
        self.built = True

    @property
    def sharded_table(self) -> ShardedWeight:
        return self.sharded_weights()[0]

    def call(self, ids):
        (rows,) = lookup_together([self.sharded_table], [ids], unique=self.unique)
        return tf.cast(rows, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            input_dim=self.input_dim,
            output_dim=self.output_dim,
            num_shards=self.num_shards,
            partition_strategy=self.partition_strategy,
            devices=self.devices,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            unique=self.unique,
        )
        return config


@serializable
class EmbeddingGroup(keras.layers.Layer):
    """Several `ShardedEmbedding` tables looked up in one call: a list of ids in, a list of rows out.

    Under parameter_server the Trainer's step then reads all the rows one ps task
    holds, of every table, in one transfer, and sends their gradient back in one
    (`lookup_together`): for many tables this is the fast layout (1.35x steps/s for 26
    tables on 2 ps, `benchmarks/stacked_lookup.py`). Elsewhere it is the tables
    called one by one. Each table keeps its own name, shards, placement and
    checkpoint; the group only calls them together.

    Args:
      tables: the tables, in the order of the ids (each used once).
    """

    def __init__(self, tables: Sequence[ShardedEmbedding], **kwargs):
        super().__init__(**kwargs)
        tables = list(tables)
        if not tables or not all(isinstance(t, ShardedEmbedding) for t in tables):
            raise ConfigError(
                f"{self.name}: EmbeddingGroup takes a non-empty list of ShardedEmbedding tables, "
                f"got {[type(t).__name__ for t in tables]}."
            )
        if len({id(t) for t in tables}) != len(tables):
            raise ConfigError(f"{self.name}: a table appears twice in the group.")
        self.tables = tables
        tf_compat.track_sublayers(self, tables)  # saved in checkpoints, each under its name

    def build(self, input_shape=None):
        for table in self.tables:  # variables now, in order: the ledger places them in this order
            if not table.built:
                table.build()
        self.built = True

    def call(self, ids: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        ids = list(ids)
        if len(ids) != len(self.tables):
            raise ValueError(
                f"{self.name}: {len(ids)} id tensors for {len(self.tables)} tables; give one per table."
            )
        rows = lookup_together(
            [t.sharded_table for t in self.tables], ids, unique=[t.unique for t in self.tables]
        )
        return [tf.cast(r, t.compute_dtype) for r, t in zip(rows, self.tables)]

    def compute_output_shape(self, input_shape):
        return [t.compute_output_shape(s) for t, s in zip(self.tables, input_shape)]

    def get_config(self):
        config = super().get_config()
        config["tables"] = [t.get_config() for t in self.tables]  # each a ShardedEmbedding
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        tables = [ShardedEmbedding.from_config(t) for t in config.pop("tables")]
        return cls(tables, **config)
