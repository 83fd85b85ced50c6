"""What keras-rs' own tests construct, served by `sharding.from_keras_rs` instead.

The vendored tests import this module in place of keras-rs' `distributed_embedding` module
(for `DistributedEmbedding`) and `embed_reduce` module (for `EmbedReduce`), and nothing else of
theirs changes: what they check of keras-rs' layers, they check of the bridge.

How many shards every table gets is set per test class (`Sharded`): test_upstream_1_shard.py and
test_upstream_3_shards.py run the same upstream tests with the bridge unsharded and sharded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import sharding

#: How the tables of the layers made here are sharded; set by `sharding_of` (`Sharded.setUp`).
_sharding: dict[str, Any] = {"num_shards": 1, "partition_strategy": "div"}


@contextlib.contextmanager
def sharding_of(num_shards: int, partition_strategy: str) -> Iterator[None]:
    """Layers made inside shard their tables so (a context, so that no test leaks its setting)."""
    previous = dict(_sharding)
    _sharding.update(num_shards=num_shards, partition_strategy=partition_strategy)
    try:
        yield
    finally:
        _sharding.update(previous)


class Sharded:
    """A mixin before an upstream test class: its tests run with `shards` shards per table, ids
    assigned to them by `partition_strategy`.

    Upstream's setUp turns Keras' and TensorFlow's traceback filtering off for the process;
    they are turned back on after each test, so that the other test files sharing a pytest
    worker see the tracebacks they would see without these tests.
    """

    shards = 1
    partition_strategy = "div"

    def setUp(self):
        keras_filtering = keras.config.is_traceback_filtering_enabled()
        tf_filtering = tf.debugging.is_traceback_filtering_enabled()
        self.addCleanup(_restore_traceback_filtering, keras_filtering, tf_filtering)
        super().setUp()
        context = sharding_of(self.shards, self.partition_strategy)
        context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)


def _restore_traceback_filtering(keras_filtering: bool, tf_filtering: bool) -> None:
    if keras_filtering:
        keras.config.enable_traceback_filtering()
    if tf_filtering:
        tf.debugging.enable_traceback_filtering()


def DistributedEmbedding(feature_configs: Any, **kwargs: Any) -> keras.layers.Layer:
    """`keras_rs.layers.DistributedEmbedding(feature_configs, **kwargs)`, as the bridge serves it."""
    return sharding.from_keras_rs(feature_configs, **_sharding, **kwargs)


def _reduced_shape(input_shape: tuple, output_dim: int) -> tuple:
    """keras-rs' `EmbedReduce.compute_output_shape`: rank-1 ids unreduced, else the last axis."""
    if len(input_shape) <= 1:
        return (*input_shape, output_dim)
    return (*input_shape[:-1], output_dim)


@keras.saving.register_keras_serializable(package="keras_rs_upstream")
class EmbedReduce(keras.layers.Layer):
    """keras-rs' `EmbedReduce(input_dim, output_dim, combiner=...)` as one bridge table.

    keras-rs' `DistributedEmbedding` off TPU is one `EmbedReduce` per table, so its
    `EmbedReduce` tests state the lookup-and-combine law the bridge follows (its
    `combiners.py`). Here that law runs through the bridge: a one-feature, one-table
    `from_keras_rs`, made when the ids' shape is known (an `EmbedReduce` takes ids of any
    rank, a `FeatureConfig` states one). `embeddings` is the whole table, as upstream's
    `Embedding.embeddings` is.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        embeddings_initializer: Any = "uniform",
        combiner: str = "mean",
        num_shards: int | None = None,
        partition_strategy: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.combiner = combiner
        self.num_shards = num_shards or _sharding["num_shards"]
        self.partition_strategy = partition_strategy or _sharding["partition_strategy"]
        self.embedding = None

    def build(self, input_shape: Any) -> None:
        import keras_rs

        table = keras_rs.layers.TableConfig(
            name="table",
            vocabulary_size=self.input_dim,
            embedding_dim=self.output_dim,
            initializer=self.embeddings_initializer,
            combiner=self.combiner,
        )
        shape = tuple(input_shape)
        feature = keras_rs.layers.FeatureConfig(
            name="feature",
            table=table,
            input_shape=shape,
            output_shape=_reduced_shape(shape, self.output_dim),
        )
        self.embedding = sharding.from_keras_rs(
            feature, num_shards=self.num_shards, partition_strategy=self.partition_strategy
        )
        self.embedding.build(shape)
        self.built = True

    def call(self, inputs: Any, weights: Any = None) -> Any:
        return self.embedding(inputs, weights)

    @property
    def embeddings(self) -> Any:
        return self.embedding.get_embedding_tables()["table"]

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            input_dim=self.input_dim,
            output_dim=self.output_dim,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            combiner=self.combiner,
            num_shards=self.num_shards,
            partition_strategy=self.partition_strategy,
        )
        return config
