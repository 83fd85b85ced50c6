"""keras-rs' configs as the bridge reads them: the FeatureConfigs flattened, their distinct
tables, what is refused (combiners, placements) and what is only warned about (per-table
optimizers), and the configs as plain data for saving."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import keras
from absl import logging

from tfdist_trainer.errors import ConfigError

COMBINERS = ("sum", "mean", "sqrtn")
#: keras-rs placements served here: both mean "the devices of the model", which are the ps tasks.
PLACEMENTS = ("auto", "default_device")


def import_keras_rs():
    try:
        import keras_rs
    except ImportError:
        raise ConfigError(
            "tfdist_trainer.sharding.from_keras_rs needs keras-rs, which is not installed: "
            "pip install 'keras-rs>=0.4,<0.5'."
        ) from None
    return keras_rs


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


def parse_features(feature_configs: Any, feature_config_cls: type) -> Features:
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


def default_optimizer(table_config_cls: type) -> Any:
    return {f.name: f.default for f in dataclasses.fields(table_config_cls)}["optimizer"]


def warn_ignored_optimizers(tables: Sequence[Any], default: Any) -> None:
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


def features_config(features: Features) -> dict[str, Any]:
    """The FeatureConfigs as plain data for a layer's `get_config`: the distinct tables once, each
    feature naming its table by index (keras-rs' own layout: Keras serializes trees, and two
    features sharing one TableConfig object must come back sharing it)."""

    entries = [
        {**config.get_config(), "table": table}
        for config, table in zip(features.configs, features.table_of)
    ]
    return {
        "tables": [table.get_config() for table in features.tables],
        "features": keras.tree.pack_sequence_as(features.structure, entries),
    }


def features_from_config(config: dict[str, Any]) -> Features:
    """The inverse of `features_config` (a tuple in the structure comes back a list, as JSON has it)."""
    keras_rs = import_keras_rs()
    tables = [keras_rs.layers.TableConfig.from_config(t) for t in config["tables"]]

    def rebuild(node: Any) -> Any:
        if isinstance(node, dict) and isinstance(node.get("table"), int):
            return keras_rs.layers.FeatureConfig(**{**node, "table": tables[node["table"]]})
        if isinstance(node, dict):
            return {key: rebuild(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            return [rebuild(value) for value in node]
        return node

    return parse_features(rebuild(config["features"]), keras_rs.layers.FeatureConfig)
