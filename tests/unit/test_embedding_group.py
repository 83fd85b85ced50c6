"""sharding.EmbeddingGroup in process: the rows and gradients of its tables called one by one, its
config round trip, a checkpoint that holds its tables, and one clear error for each misuse.

Under parameter_server (one read per ps task, gradients at the rows) it is tested on a real
cluster in tests/test_grouped_lookup.py.
"""

from __future__ import annotations

import numpy as np
import pytest


def _tables(**kwargs):
    import keras

    from tfdist_trainer import sharding

    return [
        sharding.ShardedEmbedding(
            vocab,
            3,
            num_shards=shards,
            embeddings_initializer=keras.initializers.RandomNormal(seed=seed),
            name=f"t{seed}",
            **kwargs,
        )
        for seed, (vocab, shards) in enumerate([(20, 3), (5, 1), (9, 2)])
    ]


IDS = [[[1, 19], [7, 7]], [4, 0], [[8]]]


def test_a_group_gives_each_tables_rows_and_gradients():
    import tensorflow as tf

    from tfdist_trainer import row_gradients, sharding

    tables = _tables()
    group = sharding.EmbeddingGroup(tables, name="group")
    ids = [tf.constant(i) for i in IDS]
    with tf.GradientTape() as tape, row_gradients.recording(tape) as rows:
        out = group(ids)
        loss = sum(tf.reduce_sum(r * r) * (k + 1) for k, r in enumerate(out))
    variables = [v for t in tables for v in t.trainable_variables]
    got = rows.gradient(loss, variables)
    with tf.GradientTape() as tape:
        alone = [t(i) for t, i in zip(tables, ids)]
        expected_loss = sum(tf.reduce_sum(r * r) * (k + 1) for k, r in enumerate(alone))
    expected = tape.gradient(expected_loss, variables)
    for a, b in zip(out, alone):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert all(isinstance(g, tf.IndexedSlices) for g in got)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(e), rtol=1e-6)


def test_a_groups_config_rebuilds_the_same_tables():
    import keras

    from tfdist_trainer import sharding

    group = sharding.EmbeddingGroup(_tables(partition_strategy="mod"), name="group")
    clone = sharding.EmbeddingGroup.from_config(group.get_config())
    assert [t.get_config() for t in clone.tables] == [t.get_config() for t in group.tables]
    assert isinstance(clone.tables[0], sharding.ShardedEmbedding)
    a = keras.Input((2,), dtype="int64")
    b = keras.Input((), dtype="int64")
    c = keras.Input((1,), dtype="int64")
    outputs = clone([a, b, c])
    assert [tuple(o.shape) for o in outputs] == [(None, 2, 3), (None, 3), (None, 1, 3)]


def test_a_checkpoint_holds_every_table_of_a_group(tmp_path):
    import tensorflow as tf

    from tfdist_trainer import sharding

    group = sharding.EmbeddingGroup(_tables(), name="group")
    group.build()
    path = tf.train.Checkpoint(layer=group).write(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path)}
    for table in ("t0", "t1", "t2"):
        assert any(f"/{table}/" in name for name in saved), sorted(saved)
    fresh = sharding.EmbeddingGroup(_tables(), name="group")
    fresh.build()
    for variable in fresh.weights:
        variable.assign(tf.zeros_like(variable))
    tf.train.Checkpoint(layer=fresh).read(path).assert_existing_objects_matched()
    for a, b in zip(group.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(
    "tables, message",
    [
        ([], "EmbeddingGroup takes a non-empty list of ShardedEmbedding tables, got []"),
        (
            "dense",
            "EmbeddingGroup takes a non-empty list of ShardedEmbedding tables, got ['Dense']",
        ),
        ("twice", "a table appears twice in the group"),
    ],
)
def test_a_group_of_anything_but_distinct_sharded_tables_is_one_clear_error(tables, message):
    import keras

    from tfdist_trainer import sharding
    from tfdist_trainer.errors import ConfigError

    if tables == "dense":
        tables = [keras.layers.Dense(2)]
    elif tables == "twice":
        table = _tables()[0]
        tables = [table, table]
    with pytest.raises(ConfigError) as raised:
        sharding.EmbeddingGroup(tables, name="group")
    assert message in str(raised.value)


def test_ids_for_another_number_of_tables_is_one_clear_error():
    import tensorflow as tf

    from tfdist_trainer import sharding

    group = sharding.EmbeddingGroup(_tables(), name="group")
    with pytest.raises(ValueError, match=r"group: 2 id tensors for 3 tables; give one per table"):
        group([tf.constant([1]), tf.constant([2])])
