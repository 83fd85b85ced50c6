"""sharding.from_keras_rs in process: the same outputs as keras-rs' own DistributedEmbedding for the
same weights (copied across), sparse gradients, one warning for ignored table optimizers, clear errors.

Training runs of the bridge under every strategy are in tests/test_zoo_keras_rs.py.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("keras_rs")

BATCH = 6


def _table(name: str, vocab: int = 11, dim: int = 4, **kwargs):
    import keras_rs

    return keras_rs.layers.TableConfig(
        name=name, vocabulary_size=vocab, embedding_dim=dim, **kwargs
    )


def _feature(name: str, table, input_shape: tuple):
    import keras_rs

    output_shape = (input_shape[0], table.embedding_dim)  # one embedding per example
    return keras_rs.layers.FeatureConfig(
        name=name, table=table, input_shape=input_shape, output_shape=output_shape
    )


def _both(feature_configs, inputs, num_shards: int = 3):
    """keras-rs' layer and the bridge (num_shards shards a table) with keras-rs' weights copied in."""
    import keras_rs

    from tfdist_trainer import sharding

    reference = keras_rs.layers.DistributedEmbedding(feature_configs)
    reference(inputs)  # builds its tables
    bridge = sharding.from_keras_rs(feature_configs, num_shards=num_shards)
    bridge(inputs)
    bridge.set_embedding_tables(reference.get_embedding_tables())
    return reference, bridge


def _assert_same(got, want) -> None:
    import keras

    keras.tree.assert_same_structure(got, want)
    for g, w in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        assert tuple(g.shape) == tuple(w.shape)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def _ids(shape, vocab: int = 11, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_single_id_features_match_keras_rs(combiner):
    """Dense ids of rank 1 (one id per example): looked up, not reduced; per-id weights only for 'sum'."""
    table = _table("t", combiner=combiner)
    configs = {"a": _feature("a", table, (BATCH,)), "b": _feature("b", _table("u"), (BATCH,))}
    inputs = {"a": _ids(BATCH), "b": _ids(BATCH, seed=1)}
    weights = {"a": np.linspace(0.5, 2.0, BATCH, dtype="float32"), "b": np.ones(BATCH, "float32")}
    reference, bridge = _both(configs, inputs)
    _assert_same(bridge(inputs), reference(inputs))
    _assert_same(bridge(inputs, weights), reference(inputs, weights))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_multi_id_features_match_keras_rs_for_each_combiner(combiner):
    """Several ids per example, dense [B, L] (with and without weights), ragged and sparse."""
    import tensorflow as tf

    table = _table("t", combiner=combiner)
    configs = {"x": _feature("x", table, (BATCH, 3))}
    dense = {"x": _ids((BATCH, 3))}
    weights = {"x": np.random.default_rng(2).uniform(0.1, 2.0, (BATCH, 3)).astype("float32")}
    reference, bridge = _both(configs, dense)
    _assert_same(bridge(dense), reference(dense))
    _assert_same(bridge(dense, weights), reference(dense, weights))

    rows = [[1, 2], [3], [], [4, 5, 10], [0], [7, 7]]  # an empty row, a repeated id
    ragged = {"x": tf.ragged.constant(rows, dtype=tf.int64)}
    ragged_weights = {"x": tf.ragged.constant([[0.5 * (i + 1) for i in r] for r in rows])}
    _assert_same(bridge(ragged), reference(ragged))
    _assert_same(bridge(ragged, ragged_weights), reference(ragged, ragged_weights))
    sparse = {"x": ragged["x"].to_sparse()}
    sparse_weights = {"x": ragged_weights["x"].to_sparse()}
    _assert_same(bridge(sparse), reference(sparse))
    _assert_same(bridge(sparse, sparse_weights), reference(sparse, sparse_weights))


def test_a_shared_table_is_one_sharded_table_and_matches_keras_rs():
    """Features naming one TableConfig share one table, in any nesting (dicts, lists)."""
    shared = _table("shared", combiner="mean")
    configs = {
        "query": _feature("query", shared, (BATCH,)),
        "history": [_feature("history", shared, (BATCH, 4)), _feature("y", _table("y"), (BATCH,))],
    }
    inputs = {"query": _ids(BATCH), "history": [_ids((BATCH, 4), seed=3), _ids(BATCH, seed=4)]}
    reference, bridge = _both(configs, inputs)
    _assert_same(bridge(inputs), reference(inputs))
    assert [t.name for t in bridge.tables] == ["shared", "y"]
    assert len(bridge.trainable_variables) == 2 * 3  # two tables of three shards


def test_functional_outputs_have_the_feature_structure_and_widths():
    import keras

    from tfdist_trainer import sharding

    configs = {
        "a": _feature("a", _table("t", dim=5), (None,)),
        "b": [_feature("b", _table("u"), (None, 2))],
    }
    inputs = {"a": keras.Input((), dtype="int64"), "b": [keras.Input((2,), dtype="int32")]}
    outputs = sharding.from_keras_rs(configs)(inputs)
    assert tuple(outputs["a"].shape) == (None, 5)
    assert tuple(outputs["b"][0].shape) == (None, 4)


def test_gradient_wrt_the_tables_is_indexed_slices():
    import tensorflow as tf

    configs = {
        "a": _feature("a", _table("t"), (BATCH,)),
        "b": _feature("b", _table("u"), (BATCH, 3)),
    }
    inputs = {"a": _ids(BATCH), "b": _ids((BATCH, 3), seed=5)}
    _, bridge = _both(configs, inputs)
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(o) for o in bridge(inputs).values()])
    grads = tape.gradient(loss, bridge.trainable_variables)
    assert len(grads) == 6
    assert all(isinstance(g, tf.IndexedSlices) for g in grads), [type(g) for g in grads]


def test_equal_sized_shards_do_not_start_identical():
    """A Keras initializer instance fixes its seed once; each shard still gets its own draw."""
    import keras

    from tfdist_trainer import sharding

    initializer = keras.initializers.RandomUniform(-1.0, 1.0)  # one unseeded instance
    configs = {"a": _feature("a", _table("t", vocab=10, initializer=initializer), (BATCH,))}
    bridge = sharding.from_keras_rs(configs, num_shards=2)
    bridge({"a": _ids(BATCH, vocab=10)})
    first, second = (np.asarray(v) for v in bridge.trainable_variables)
    assert first.shape == second.shape == (5, 4)
    assert not np.allclose(first, second)


def test_table_optimizers_are_named_in_one_warning(caplog):
    import keras

    from tfdist_trainer import sharding

    configs = {
        "a": _feature("a", _table("t", optimizer=keras.optimizers.Adagrad()), (BATCH,)),
        "b": _feature("b", _table("u", optimizer="sgd"), (BATCH,)),
        "c": _feature("c", _table("v"), (BATCH,)),  # keras-rs' default: no warning for it
    }
    with caplog.at_level(logging.WARNING):
        sharding.from_keras_rs(configs)
    lines = [r.getMessage() for r in caplog.records if "TableConfig.optimizer" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "'t', 'u'" in lines[0] and "'v'" not in lines[0], lines
    assert "Trainer's optimizer" in lines[0], lines


def test_what_cannot_be_served_is_one_config_error(monkeypatch):
    from tfdist_trainer import sharding
    from tfdist_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="placement='sparsecore'"):
        sharding.from_keras_rs({"a": _feature("a", _table("t", placement="sparsecore"), (BATCH,))})
    with pytest.raises(ConfigError, match="two different TableConfigs are named 't'"):
        sharding.from_keras_rs(
            {"a": _feature("a", _table("t"), (BATCH,)), "b": _feature("b", _table("t"), (BATCH,))}
        )
    with pytest.raises(ConfigError, match="input_shape"):
        sharding.from_keras_rs({"a": _feature("a", _table("t"), (BATCH,))})({"a": _ids((BATCH, 2))})
    monkeypatch.setitem(__import__("sys").modules, "keras_rs", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs keras-rs, which is not installed"):
        sharding.from_keras_rs({})
