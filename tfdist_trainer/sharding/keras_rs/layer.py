"""The bridge's layer, `KerasRsEmbedding`, and `from_keras_rs`, which makes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.fixed.embedding import ShardedEmbedding
from tfdist_trainer.sharding.fixed.grouped_lookup import lookup_together
from tfdist_trainer.sharding.keras_rs.combiners import flat_ids, reduce_rows
from tfdist_trainer.sharding.keras_rs.features import (
    Features,
    default_optimizer,
    features_config,
    features_from_config,
    import_keras_rs,
    parse_features,
    warn_ignored_optimizers,
)
from tfdist_trainer.sharding.saving import serializable


def from_keras_rs(
    feature_configs: Any,
    *,
    num_shards: int | None = None,
    partition_strategy: str = "div",
    devices: Sequence[str] | None = None,
    unique: bool = True,
    name: str | None = None,
    table_stacking: Any = "auto",
    update_stats: bool = False,
) -> KerasRsEmbedding:
    """A drop-in for `keras_rs.layers.DistributedEmbedding(feature_configs)` whose tables shard themselves.

    Args:
      feature_configs: a nested structure (dicts, lists, tuples) of
        `keras_rs.layers.FeatureConfig`; the layer's inputs and outputs have this structure.
      num_shards: shards per table, capped at each table's rows; None: one per ps task
        under parameter_server (one per device with `devices`), else 1.
      partition_strategy: "div" or "mod" (see `ShardLayout`).
      devices: outside parameter_server, devices to spread the shards over (model parallelism).
      unique: gather each distinct id once per table and batch.
      name: the layer's name (default: Keras' own).
      table_stacking: accepted and ignored, as keras-rs ignores it off SparseCore (each table
        here is its own `ShardedEmbedding`).
      update_stats: must be False: keras-rs' SparseCore statistics exist only under JAX, and
        keras-rs' TensorFlow layer refuses True with a ValueError (so does this one).

    Raises:
      ConfigError (a ValueError): keras-rs is not installed, a config cannot be served here, or
        `update_stats` is True.
    """
    del table_stacking
    if update_stats:
        raise ConfigError(
            "from_keras_rs: update_stats=True needs keras-rs' JAX SparseCore layer (keras-rs' "
            "TensorFlow layer refuses it too); leave it False."
        )
    keras_rs = import_keras_rs()
    features = parse_features(feature_configs, keras_rs.layers.FeatureConfig)
    warn_ignored_optimizers(features.tables, default_optimizer(keras_rs.layers.TableConfig))
    return KerasRsEmbedding(
        features,
        num_shards=num_shards,
        partition_strategy=partition_strategy,
        devices=devices,
        unique=unique,
        name=name,
    )


@serializable
class KerasRsEmbedding(keras.layers.Layer):
    """keras-rs features looked up in self-sharding tables; made by `from_keras_rs`.

    One `ShardedEmbedding` per distinct `TableConfig` (named after it). The ids
    of every feature sharing a table are looked up together, and all tables in
    one `lookup_together` (inside the Trainer's step under parameter_server: one
    read per ps task; elsewhere one gather per shard); then each feature is
    reduced by its table's combiner.
    """

    def __init__(
        self,
        features: Features,
        *,
        num_shards: int | None = None,
        partition_strategy: str = "div",
        devices: Sequence[str] | None = None,
        unique: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.features = features
        self.num_shards = num_shards
        self.partition_strategy = partition_strategy
        self.devices = list(devices) if devices else None
        self.unique = unique
        self.tables = [
            ShardedEmbedding(
                table.vocabulary_size,
                table.embedding_dim,
                num_shards=None if num_shards is None else min(num_shards, table.vocabulary_size),
                partition_strategy=partition_strategy,
                devices=devices,
                embeddings_initializer=table.initializer,
                unique=unique,
                name=table.name,
            )
            for table in features.tables
        ]
        # Saved in checkpoints, each under its TableConfig's name (a list alone is not, in Keras 3).
        tf_compat.track_sublayers(self, self.tables)

    def build(self, input_shapes=None):
        if input_shapes is not None:
            self._check_input_shapes(input_shapes)
        for table in self.tables:  # variables now, under the current device and strategy scope
            table.build()
        self.built = True

    def _check_input_shapes(self, input_shapes: Any) -> None:
        for config, where, shape in zip(
            self.features.configs, self.features.paths, self._flatten(input_shapes, "input")
        ):
            expected = tuple(config.input_shape)
            shape = tuple(shape)
            if len(shape) < 1 or len(shape) != len(expected):
                raise ConfigError(
                    f"feature {where}: input of shape {shape} where its FeatureConfig says "
                    f"input_shape={expected}; give ids of rank {len(expected)}."
                )

    def _flatten(self, nested: Any, what: str) -> list:
        """`nested` in the FeatureConfigs' structure -> one entry per feature, in their order."""
        entries: list = []
        try:
            keras.tree.map_structure_up_to(self.features.structure, entries.append, nested)
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"{self.name}: the {what} must have the structure of the FeatureConfigs "
                f"({', '.join(self.features.paths)}): {e}"
            ) from None
        return entries

    def call(self, inputs: Any, weights: Any = None, training: bool = False) -> Any:
        del training  # the lookup is the same in training and inference
        ids = self._flatten(inputs, "inputs")
        per_id = self._flatten(weights, "weights") if weights is not None else [None] * len(ids)
        rows = self._lookup(ids)
        outputs = [
            reduce_rows(
                x, r, w, self.features.tables[t].combiner, self.features.tables[t].embedding_dim
            )
            for x, r, w, t in zip(ids, rows, per_id, self.features.table_of)
        ]
        return keras.tree.pack_sequence_as(self.features.structure, outputs)

    def _lookup(self, ids: list) -> list[tf.Tensor]:
        """The rows of every feature's flat ids: the features of a table together, all tables in
        one `lookup_together` (one read per ps task inside the Trainer's step)."""
        flat = [flat_ids(x) for x in ids]
        owned = [
            [i for i, owner in enumerate(self.features.table_of) if owner == t]
            for t in range(len(self.tables))
        ]
        together = lookup_together(
            [table.sharded_table for table in self.tables],
            [tf.concat([flat[i] for i in mine], 0) for mine in owned],
            unique=[table.unique for table in self.tables],
        )
        rows: list[Any] = [None] * len(ids)
        for table, mine, table_rows in zip(self.tables, owned, together):
            table_rows = tf.cast(table_rows, table.compute_dtype)
            for i, part in zip(mine, tf.split(table_rows, [tf.size(flat[i]) for i in mine])):
                rows[i] = part
        return rows

    def compute_output_shape(self, input_shapes: Any) -> Any:
        outputs = [
            _output_shape(tuple(shape), config.table.embedding_dim)
            for config, shape in zip(self.features.configs, self._flatten(input_shapes, "input"))
        ]
        return keras.tree.pack_sequence_as(self.features.structure, outputs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            feature_configs=features_config(self.features),
            num_shards=self.num_shards,
            partition_strategy=self.partition_strategy,
            devices=self.devices,
            unique=self.unique,
        )
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> KerasRsEmbedding:
        config = dict(config)
        return cls(features_from_config(config.pop("feature_configs")), **config)

    # -- the tables as whole tensors (keras-rs' get_embedding_tables) -------------------
    def get_embedding_tables(self) -> dict[str, tf.Tensor]:
        """Each table as one [vocabulary_size, embedding_dim] tensor, by TableConfig name."""
        return {table.name: _whole_table(table) for table in self.tables}

    def set_embedding_tables(self, tables: Mapping[str, Any]) -> None:
        """Assigns whole [vocabulary_size, embedding_dim] tables (by name) to their shards.

        For copying weights from a `keras_rs.layers.DistributedEmbedding`
        (its `get_embedding_tables()`), or from any other source.
        """
        known = {table.name: table for table in self.tables}
        unknown = sorted(set(tables) - set(known))
        if unknown:
            raise ConfigError(
                f"{self.name}: no table named {', '.join(unknown)}; have {sorted(known)}."
            )
        for name, value in tables.items():
            _assign_whole_table(known[name], np.asarray(value))


def _output_shape(input_shape: tuple, dim: int) -> tuple:
    """keras-rs' EmbedReduce: rank-1 ids keep their shape, more reduce the last dimension."""
    return (*input_shape, dim) if len(input_shape) <= 1 else (*input_shape[:-1], dim)


def _whole_table(table: ShardedEmbedding) -> tf.Tensor:
    layout = table.sharded_table.layout
    rows = [tf.constant(layout.logical_rows(i), tf.int32) for i in range(layout.num_shards)]
    return tf.dynamic_stitch(rows, [tf.convert_to_tensor(v) for v in table.shards])


def _assign_whole_table(table: ShardedEmbedding, value: np.ndarray) -> None:
    layout = table.sharded_table.layout
    expected = (layout.vocab, table.output_dim)
    if value.shape != expected:
        raise ConfigError(
            f"table {table.name!r}: got a table of shape {value.shape}, expected {expected}."
        )
    for i, shard in enumerate(table.shards):
        shard.assign(value[layout.logical_rows(i)])
