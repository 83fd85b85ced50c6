"""`from_keras_rs(feature_configs)`: keras-rs embedding configs, served by self-sharding tables.

keras-rs 0.4's `keras_rs.layers.DistributedEmbedding` accelerates only TPU
SparseCore. On TF CPU/GPU it is one plain Keras `Embedding` per table, so under
parameter_server every table lands whole on one ps, and `TableConfig.optimizer`
is ignored (docs/design.md, "Why large tables shard themselves"). This bridge keeps the keras-rs configs
(`TableConfig`, `FeatureConfig`, in any nesting) as the source of truth and
returns a drop-in layer: same nested inputs and outputs, same combiners, one
`ShardedEmbedding` per table, so each table is split by rows over the ps tasks
(bytes-balanced), lookups are sparse gathers and gradients `tf.IndexedSlices`.

    import keras_rs
    from tfdist_trainer import sharding

    table = keras_rs.layers.TableConfig(name="item", vocabulary_size=1_000_000, embedding_dim=16)
    features = {"item": keras_rs.layers.FeatureConfig("item", table, (None,), (None, 16))}
    embedding = sharding.from_keras_rs(features)  # was: keras_rs.layers.DistributedEmbedding(features)

What follows keras-rs 0.4 exactly (its `EmbedReduce`): ids of rank 1 are looked
up without reduction; ids of rank 2 or more (dense), `tf.RaggedTensor` ragged
in dimension 1, and `tf.SparseTensor` are reduced over their last dimension by
the table's combiner ('sum', 'mean', 'sqrtn', with optional per-id `weights`
of the same structure; empty rows give zeros); features naming the same
`TableConfig` object share one table. What differs: ids must lie in
[0, vocabulary_size) (keras-rs wraps negative ids; here they fail an
assertion); output shapes follow the input's batch dimension (None in a
functional model) where keras-rs reports `FeatureConfig.output_shape`
literally; an input whose rank disagrees with `FeatureConfig.input_shape` is an
error (keras-rs computes that check and drops the result); the initializer runs
once per shard (the same law as keras-rs's for its default `fan_out` scaling, a
`fan_in` scaling sees the shard's rows); `TableConfig.optimizer` is not honoured
(one warning names the tables; the Trainer's optimizer trains them, as keras-rs
off TPU trains them with the model's); placement "sparsecore" is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.embedding import ShardedEmbedding
from tfdist_trainer.sharding.grouped_lookup import lookup_together

COMBINERS = ("sum", "mean", "sqrtn")
#: keras-rs placements served here: both mean "the devices of the model", which are the ps tasks.
PLACEMENTS = ("auto", "default_device")


def from_keras_rs(
    feature_configs: Any,
    *,
    num_shards: int | None = None,
    partition_strategy: str = "div",
    devices: Sequence[str] | None = None,
    unique: bool = True,
    name: str | None = None,
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

    Raises:
      ConfigError: keras-rs is not installed, or a config cannot be served here.
    """
    keras_rs = _import_keras_rs()
    features = _parse_features(feature_configs, keras_rs.layers.FeatureConfig)
    _warn_ignored_optimizers(features.tables, _default_optimizer(keras_rs.layers.TableConfig))
    return KerasRsEmbedding(
        features,
        num_shards=num_shards,
        partition_strategy=partition_strategy,
        devices=devices,
        unique=unique,
        name=name,
    )


def _import_keras_rs():
    try:
        import keras_rs
    except ImportError:
        raise ConfigError(
            "tfdist_trainer.sharding.from_keras_rs needs keras-rs, which is not installed: "
            "pip install 'keras-rs>=0.4,<0.5'."
        ) from None
    return keras_rs


# -- configs -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Features:
    """The user's FeatureConfigs, flattened in `keras.tree` order, with their distinct tables.

    A plain holder, so that Keras' attribute tracking leaves the user's nesting untouched.
    """

    structure: Any  # the nested FeatureConfigs as given
    paths: tuple[str, ...]  # "a.0.b": each feature's place in the structure
    configs: tuple[Any, ...]  # each feature's FeatureConfig
    tables: tuple[Any, ...]  # the distinct TableConfigs, in order of first use
    table_of: tuple[int, ...]  # each feature's index into `tables`


def _parse_features(feature_configs: Any, feature_config_cls: type) -> Features:
    flat = keras.tree.flatten_with_path(feature_configs)
    if not flat:
        raise ConfigError("from_keras_rs: feature_configs holds no keras_rs FeatureConfig.")
    paths, configs, tables, table_of, index = [], [], [], [], {}
    for path, config in flat:
        where = ".".join(str(p) for p in path) or "<root>"
        _check_feature(where, config, feature_config_cls)
        if id(config.table) not in index:  # keras-rs shares a table by identity, not equality
            index[id(config.table)] = len(tables)
            tables.append(config.table)
        paths.append(where)
        configs.append(config)
        table_of.append(index[id(config.table)])
    _check_table_names(tables)
    return Features(feature_configs, tuple(paths), tuple(configs), tuple(tables), tuple(table_of))


def _check_feature(where: str, config: Any, feature_config_cls: type) -> None:
    if not isinstance(config, feature_config_cls):
        raise ConfigError(
            f"from_keras_rs: feature {where} is a {type(config).__name__}, not a "
            f"keras_rs.layers.FeatureConfig (tf.tpu.experimental.embedding configs need a TPU)."
        )
    table = config.table
    if table.combiner not in COMBINERS:
        raise ConfigError(
            f"from_keras_rs: table {table.name!r} has combiner={table.combiner!r}; "
            f"use one of {', '.join(COMBINERS)}."
        )
    if table.placement not in PLACEMENTS:
        raise ConfigError(
            f"from_keras_rs: table {table.name!r} has placement={table.placement!r}, which needs a "
            f"TPU with SparseCore; use 'auto' (its tables are sharded over the ps tasks)."
        )


def _check_table_names(tables: Sequence[Any]) -> None:
    """Distinct tables need distinct names: they name the layers and the checkpointed tables."""
    seen = set()
    for table in tables:
        if table.name in seen:
            raise ConfigError(
                f"from_keras_rs: two different TableConfigs are named {table.name!r}; rename one, "
                f"or pass the same TableConfig object to share a table."
            )
        seen.add(table.name)


def _default_optimizer(table_config_cls: type) -> Any:
    return {f.name: f.default for f in dataclasses.fields(table_config_cls)}["optimizer"]


def _warn_ignored_optimizers(tables: Sequence[Any], default: Any) -> None:
    """One warning line for every table that asks for its own optimizer: it is not honoured.

    Keras 3 applies one optimizer to a model, and the Trainer owns it: per-table
    optimizers would need a second optimizer inside the Trainer's step.
    """
    custom = [t for t in tables if not _same_optimizer(t.optimizer, default)]
    if custom:
        logging.warning(
            "keras-rs TableConfig.optimizer is not honoured for table(s) %s (%s): the Trainer's "
            "optimizer (build_optimizer) trains them, as keras-rs itself does off TPU.",
            ", ".join(repr(t.name) for t in custom),
            ", ".join(_optimizer_name(t.optimizer) for t in custom),
        )


def _same_optimizer(optimizer: Any, default: Any) -> bool:
    return isinstance(optimizer, str) and isinstance(default, str) and optimizer == default


def _optimizer_name(optimizer: Any) -> str:
    return optimizer if isinstance(optimizer, str) else type(optimizer).__name__


# -- the layer ---------------------------------------------------------------------------


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
            _reduce(
                x, r, w, self.features.tables[t].combiner, self.features.tables[t].embedding_dim
            )
            for x, r, w, t in zip(ids, rows, per_id, self.features.table_of)
        ]
        return keras.tree.pack_sequence_as(self.features.structure, outputs)

    def _lookup(self, ids: list) -> list[tf.Tensor]:
        """The rows of every feature's flat ids: the features of a table together, all tables in
        one `lookup_together` (one read per ps task inside the Trainer's step)."""
        flat = [_flat_ids(x) for x in ids]
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


# -- lookup and reduction (keras-rs' EmbedReduce semantics) -----------------------------


def _ids_tensor(values: tf.Tensor) -> tf.Tensor:
    """int64 ids (Keras' Embedding casts non-integer ids to integers too; features sharing a
    table may come as int32 and int64)."""
    return tf.cast(values, tf.int64)


def _flat_ids(x: Any) -> tf.Tensor:
    if isinstance(x, tf.SparseTensor):
        return _ids_tensor(x.values)
    if isinstance(x, tf.RaggedTensor):
        if x.ragged_rank != 1 or x.shape.rank != 2:
            raise ConfigError(
                f"from_keras_rs: ragged ids must be 2-D, ragged in dimension 1 (as keras-rs "
                f"asks), got shape {x.shape} with ragged_rank {x.ragged_rank}."
            )
        return _ids_tensor(x.values)
    return tf.reshape(_ids_tensor(tf.convert_to_tensor(x)), [-1])


def _reduce(x: Any, rows: tf.Tensor, weights: Any, combiner: str, dim: int) -> tf.Tensor:
    """One feature's looked-up `rows` (one per id, flat) -> its embedding, per keras-rs' combiner."""
    if isinstance(x, tf.SparseTensor):
        return _reduce_sparse(x, rows, weights, combiner, dim)
    if isinstance(x, tf.RaggedTensor):
        segments = tf.cast(x.value_rowids(), tf.int32)
        w = None if weights is None else _values(weights)
        return _segment_reduce(rows, w, segments, tf.cast(x.nrows(), tf.int32), combiner)
    return _reduce_dense(tf.convert_to_tensor(x), rows, weights, combiner, dim)


def _values(weights: Any) -> tf.Tensor:
    """The per-id weights of a ragged or sparse feature: its values, in the ids' order."""
    if isinstance(weights, tf.RaggedTensor):
        return weights.values
    if isinstance(weights, tf.SparseTensor):
        return weights.values
    raise ConfigError(
        f"from_keras_rs: weights of a ragged or sparse feature must be of the same kind, "
        f"got a {type(weights).__name__}."
    )


def _reduce_dense(
    ids: tf.Tensor, rows: tf.Tensor, weights: Any, combiner: str, dim: int
) -> tf.Tensor:
    rows = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
    rows.set_shape(ids.shape.concatenate([dim]))
    if ids.shape.rank == 1:  # one id per example: nothing to reduce; only 'sum' applies weights
        if weights is None or combiner != "sum":
            return rows
        return rows * _expand_to(tf.cast(weights, rows.dtype), 2)
    w = _expand_to(_weights_or_ones(weights, ids, rows.dtype), ids.shape.rank + 1)
    total = tf.reduce_sum(rows * w, axis=-2)
    return _divide(total, tf.reduce_sum(w, axis=-2), tf.reduce_sum(w * w, axis=-2), combiner)


def _weights_or_ones(weights: Any, like: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The per-id weights, or 1 for every id (keras-rs' ones_like) when none are given."""
    return tf.ones_like(like, dtype=dtype) if weights is None else tf.cast(weights, dtype)


def _expand_to(tensor: tf.Tensor, rank: int) -> tf.Tensor:
    """Trailing axes of size 1 up to `rank` (how keras-rs broadcasts weights over the rows)."""
    for _ in range(rank - tensor.shape.rank):
        tensor = tensor[..., None]
    return tensor


def _reduce_sparse(
    x: tf.SparseTensor, rows: tf.Tensor, weights: Any, combiner: str, dim: int
) -> tf.Tensor:
    """Reduces over the last dimension of a sparse [..., L] feature; absent ids count for nothing."""
    if x.shape.rank is not None and x.shape.rank < 2:
        raise ConfigError(f"from_keras_rs: sparse ids must have rank 2 or more, got {x.shape}.")
    outer = x.dense_shape[:-1]
    strides = tf.math.cumprod(outer, exclusive=True, reverse=True)
    segments = tf.cast(tf.reduce_sum(x.indices[:, :-1] * strides, axis=1), tf.int32)
    w = None if weights is None else _values(weights)
    reduced = _segment_reduce(rows, w, segments, tf.cast(tf.reduce_prod(outer), tf.int32), combiner)
    shape = tf.concat([outer, [dim]], 0)
    out = tf.reshape(reduced, shape)
    if x.shape.rank is not None:
        out.set_shape(x.shape[:-1].concatenate([dim]))
    return out


def _segment_reduce(
    rows: tf.Tensor, weights: tf.Tensor | None, segments: tf.Tensor, count: tf.Tensor, combiner: str
) -> tf.Tensor:
    """Sums rows (times their weights) per segment (example) and applies the combiner's divisor."""
    w = _weights_or_ones(weights, segments, rows.dtype)
    total = tf.math.unsorted_segment_sum(rows * w[:, None], segments, count)
    weight_sum = tf.math.unsorted_segment_sum(w, segments, count)[:, None]
    square_sum = tf.math.unsorted_segment_sum(w * w, segments, count)[:, None]
    return _divide(total, weight_sum, square_sum, combiner)


def _divide(total: tf.Tensor, weight_sum: tf.Tensor, square_sum: tf.Tensor, combiner: str):
    if combiner == "sum":
        return total
    if combiner == "mean":
        return tf.math.divide_no_nan(total, weight_sum)
    return tf.math.divide_no_nan(total, tf.sqrt(square_sum))


# -- whole tables <-> shards --------------------------------------------------------------


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
