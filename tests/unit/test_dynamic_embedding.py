"""DynamicEmbedding in one process, no strategy: rows made on first sight, admission, LFU and age
eviction, slot resets, string keys, read-only inference, checkpoints and the bad inputs' messages."""

from __future__ import annotations

from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist_trainer import sharding
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.dynamic import checkpoint as dynamic_checkpoint
from tfdist_trainer.sharding.dynamic import keys as dynamic_keys


def _layer(capacity=8, **kwargs) -> sharding.DynamicEmbedding:
    kwargs.setdefault("embeddings_initializer", keras.initializers.RandomUniform(-1, 1, seed=3))
    layer = sharding.DynamicEmbedding(4, capacity, name="ids", **kwargs)
    layer.build(None)
    return layer


def _keys(*values) -> tf.Tensor:
    return tf.constant(values, tf.int64)


def _row(layer, key: int, shard: int = 0) -> int:
    """The key's row, or -1 for none."""
    return int(layer.shards[shard].key_rows.lookup(_keys(key))[0])


def _stats(layer) -> dict[str, float]:
    return {k.split("/", 1)[1]: v for k, v in sharding.dynamic_table_stats(layer).items()}


def _pool(layer, shard: int = 0) -> np.ndarray:
    return layer.shards[shard].pool.numpy()


def _default(layer) -> np.ndarray:
    return layer.default_row.numpy()[0]


def test_keys_get_their_own_rows_on_first_sight_and_keep_them():
    layer = _layer()
    out = layer(tf.constant([[10, 20], [10, 2**62]], tf.int64), training=True).numpy()
    assert out.shape == (2, 2, 4)
    rows = [_row(layer, k) for k in (10, 20, 2**62)]
    assert sorted(rows) == [0, 1, 2]
    np.testing.assert_array_equal(out[0, 0], out[1, 0])  # one key, one row
    np.testing.assert_array_equal(out[1, 1], _pool(layer)[_row(layer, 2**62)])
    layer(_keys(20, 30), training=True)
    assert _row(layer, 20) == rows[1]
    assert _stats(layer)["rows_in_use"] == 4 and _stats(layer)["admitted"] == 4


def test_a_key_reads_the_default_row_until_it_is_seen_min_count_times():
    layer = _layer(min_count=3)
    default = _default(layer)
    for _ in range(2):
        out = layer(_keys(7), training=True).numpy()
        np.testing.assert_array_equal(out[0], default)
        assert _row(layer, 7) == -1
    assert _stats(layer)["rows_in_use"] == 0
    layer(_keys(7), training=True)  # the third sighting
    assert _row(layer, 7) == 0 and _stats(layer)["admitted"] == 1
    layer(_keys(8, 8, 8), training=True)  # three sightings in one batch count as three
    assert _row(layer, 8) == 1


def test_a_full_shard_evicts_its_least_frequently_used_rows():
    layer = _layer(capacity=4)  # an eviction frees max(1, 4 // 16) = 1 row
    for keys in [(1, 2, 3, 4), (1, 2, 4), (1, 2, 4), (1, 2)]:
        layer(_keys(*keys), training=True)
    freed = _row(layer, 3)  # seen once: the least frequently used
    layer(_keys(5), training=True)
    assert _row(layer, 3) == -1 and _row(layer, 5) == freed
    assert all(_row(layer, k) >= 0 for k in (1, 2, 4))
    stats = _stats(layer)
    assert stats["evicted"] == 1 and stats["rows_in_use"] == 4 and stats["admitted"] == 5


def test_rows_not_seen_for_max_age_steps_are_freed():
    layer = _layer(max_age_steps=2)  # swept every max(1, 2 // 8) = 1 step
    layer(_keys(1), training=True)  # step 1
    for _ in range(2):  # steps 2, 3: key 1 is 2 steps old, not yet more
        layer(_keys(2), training=True)
    assert _row(layer, 1) >= 0
    layer(_keys(2), training=True)  # step 4: last seen at 1 < 4 - 2
    assert _row(layer, 1) == -1 and _row(layer, 2) >= 0
    stats = _stats(layer)
    assert stats["expired"] == 1 and stats["rows_in_use"] == 1 and stats["evicted"] == 0


def _sgd_step(layer, optimizer):
    @tf.function
    def step(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(keys, training=True))  # a gradient of ones on each row read
        gradients = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply(gradients, layer.trainable_variables)
        return gradients

    return step


def test_an_evicted_row_is_drawn_anew_and_its_adagrad_accumulator_reset():
    layer = _layer(capacity=2)
    optimizer = sharding.SparseAdagrad(0.5, initial_accumulator_value=0.1)
    optimizer.build(layer.trainable_variables)
    step = _sgd_step(layer, optimizer)
    gradients = step(_keys(1, 2))
    pool_gradient = gradients[[v.path for v in layer.trainable_variables].index("ids/pool_shard_0")]
    assert isinstance(pool_gradient, tf.IndexedSlices)
    step(_keys(1))
    accumulator = tf_accumulator(optimizer, layer)
    row = _row(layer, 2)
    trained = _pool(layer)[row].copy()
    assert accumulator.numpy()[row].min() > 0.1
    untouched = _default(layer).copy()
    step(_keys(1, 3))  # key 2 (seen once) makes room for key 3
    assert _row(layer, 2) == -1 and _row(layer, 3) == row
    # Key 3's row was drawn anew, then trained once from a reset accumulator (0.1 + 1^2).
    assert not np.allclose(_pool(layer)[row], trained)
    np.testing.assert_allclose(accumulator.numpy()[row], 1.1, rtol=1e-6)
    np.testing.assert_allclose(accumulator.numpy()[_row(layer, 1)], 3.1, rtol=1e-6)
    np.testing.assert_array_equal(_default(layer), untouched)  # no key read it


@pytest.mark.parametrize("optimizer_cls", [sharding.SGD, sharding.SparseAdagrad])
def test_an_update_never_lands_on_a_row_given_to_another_key_after_the_step_read_it(optimizer_cls):
    # The step reads keys 1..4 (every row), then, before its update, a second call of the layer
    # meets keys 11..14: the full shard evicts 1..4 and gives their rows to the new keys. The
    # update of 1..4 must not land on 11..14, whose rows must stay as drawn (ones).
    layer = _layer(capacity=4, embeddings_initializer="ones")
    optimizer = optimizer_cls(0.5)
    optimizer.build(layer.trainable_variables)

    @tf.function
    def step(keys, later_keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(keys, training=True))
        gradients = tape.gradient(loss, layer.trainable_variables)
        with tf.control_dependencies([tf.nest.flatten(gradients, expand_composites=True)[0]]):
            later = layer(later_keys, training=True)  # outside the tape: no gradient of its own
        with tf.control_dependencies([later]):
            optimizer.apply(gradients, layer.trainable_variables)

    step(_keys(1, 2, 3, 4), _keys(11, 12, 13, 14))
    assert [_row(layer, k) for k in (1, 2, 3, 4)] == [-1] * 4
    rows = sorted(_row(layer, k) for k in (11, 12, 13, 14))
    assert rows == [0, 1, 2, 3]
    np.testing.assert_array_equal(_pool(layer), np.ones((4, 4), np.float32))


def tf_accumulator(optimizer, layer):
    from tfdist_trainer import tf_compat

    return tf_compat.adagrad_accumulator(optimizer, layer.shards[0].pool)


def test_string_keys_are_their_64_bit_fingerprints():
    layer = _layer(key_dtype="string", num_shards=2)
    out = layer(tf.constant(["a", "bb", "a"]), training=True).numpy()
    np.testing.assert_array_equal(out[0], out[2])
    assert _stats(layer)["rows_in_use"] == 2
    # tf.fingerprint (FarmHash) is stable across platforms and versions: the key of "a" never changes.
    a = -5528939962900187677
    assert tf.bitcast(tf.fingerprint(tf.constant(["a"])), tf.int64).numpy()[0] == a
    assert max(_row(layer, a, shard) for shard in (0, 1)) >= 0


def test_inference_never_inserts_and_reads_the_default_row_for_unseen_keys():
    layer = _layer(num_shards=2)
    for training in (False, None):
        out = layer(_keys(1, 2, 3), training=training).numpy()
        for i in range(3):
            np.testing.assert_array_equal(out[i], _default(layer))
    assert _stats(layer)["rows_in_use"] == 0
    layer(_keys(1), training=True)
    assert _stats(layer)["rows_in_use"] == 1
    layer(_keys(1, 2), training=False)
    assert _stats(layer)["rows_in_use"] == 1


def _model(num_shards=2, capacity=8, **kwargs) -> keras.Model:
    keys = keras.Input((2,), dtype="int64")
    rows = sharding.DynamicEmbedding(
        3,
        capacity,  # 2 shards: 4 rows a shard, at least the 4 distinct keys of a batch
        num_shards=num_shards,
        min_count=2,
        embeddings_initializer=keras.initializers.RandomUniform(-1, 1, seed=1),
        name="ids",
        **kwargs,
    )(keys)
    return keras.Model(keys, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(rows)))


_BATCHES = [np.array([[i % 7, (3 * i) % 11], [i % 5, 100 + i]], np.int64) for i in range(20)]


def _trainer(**kwargs):
    """(model, optimizer, traced training step) of `_model(**kwargs)` under SparseAdagrad."""
    model = _model(**kwargs)
    optimizer = sharding.SparseAdagrad(0.1)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(keys, training=True) - 1.0))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    return model, optimizer, step


def test_a_checkpoint_round_trips_keys_rows_slots_and_counts_and_a_resumed_run_continues_exactly(
    tmp_path,
):
    batches, trainer = _BATCHES, _trainer
    model, optimizer, step = trainer()
    for keys in batches[:16]:
        step(keys)
    stats = sharding.dynamic_table_stats(model)
    assert stats["ids/evicted"] > 0 and stats["ids/admitted"] > 0  # evictions are in the state
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    restored, restored_optimizer, restored_step = trainer()
    tf.train.Checkpoint(model=restored, optimizer=restored_optimizer).restore(
        path
    ).assert_consumed()
    probe = np.array([[k, k + 1] for k in range(0, 120, 3)], np.int64)  # seen and unseen keys
    np.testing.assert_array_equal(model(probe).numpy(), restored(probe).numpy())
    assert sharding.dynamic_table_stats(restored) == stats
    for keys in batches[16:]:
        step(keys)
        restored_step(keys)
    np.testing.assert_array_equal(model(probe).numpy(), restored(probe).numpy())
    assert sharding.dynamic_table_stats(restored) == sharding.dynamic_table_stats(model)


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"capacity": 0}, r"capacity \(rows of the table\) must be an integer >= 1"),
        ({"min_count": 0}, "min_count must be an integer >= 1"),
        ({"max_age_steps": 0}, "max_age_steps must be None or an integer >= 1"),
        ({"key_dtype": "float32"}, "key_dtype must be 'int64' or 'string'"),
        ({"embeddings_initializer": "glorot_uniform"}, "embeddings_initializer must be one of"),
        ({"stacked_features": 0}, "stacked_features must be None or an integer >= 1"),
        ({"eviction": "fifo"}, "eviction must be one of 'lfu', 'lru', got 'fifo'"),
    ],
)
def test_bad_arguments_are_one_sentence(kwargs, fragment):
    args = {"output_dim": 4, "capacity": 8, **kwargs}
    with pytest.raises(ConfigError, match=fragment):
        sharding.DynamicEmbedding(name="ids", **args)


@pytest.mark.parametrize(
    "key_dtype, keys, fragment",
    [
        ("int64", tf.constant([1.5, 2.0]), "key_dtype='int64' needs integer ids, got float32"),
        ("int64", tf.constant(["a"]), "key_dtype='int64' needs integer ids, got string"),
        ("string", tf.constant([1], tf.int64), "key_dtype='string' but the keys are int64"),
        ("int64", tf.ragged.constant([[1], [2, 3]], tf.int64), "must be a dense tensor"),
    ],
)
def test_keys_of_the_wrong_kind_are_one_sentence(key_dtype, keys, fragment):
    layer = _layer(key_dtype=key_dtype)
    with pytest.raises(ConfigError, match=fragment):
        layer(keys, training=True)


def test_a_batch_with_more_distinct_keys_than_a_shard_holds_names_layer_shard_and_capacity():
    from tfdist_trainer.runtime.config_checks import config_checks_are_config_errors

    layer = _layer(capacity=4)
    with pytest.raises(ConfigError) as error, config_checks_are_config_errors():
        layer(_keys(1, 2, 3, 4, 5), training=True)
    # One sentence with the numbers: the keys that needed a row, the rows, the capacity to set.
    assert str(error.value) == (
        "ids shard 0: one batch brought 5 distinct keys that need a row to this shard, which "
        "holds 4 rows; raise capacity to at least 5 (1 shard(s) x the keys this shard got)."
    )


def test_replicated_strategies_are_refused_with_what_to_use_instead():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        layer = sharding.DynamicEmbedding(4, 8, name="ids")
        refusal = "one_device or parameter_server only, not mirrored \\(every replica"
        with pytest.raises(ConfigError, match=refusal):
            layer.build(None)


def test_a_call_wrapped_by_model_parallel_placement_is_refused():
    layer = _layer()
    original = layer.call
    layer.call = lambda *args, **kwargs: original(*args, **kwargs)
    with pytest.raises(ConfigError, match="does not run under model_parallel"):
        layer(_keys(1), training=True)


def test_a_slot_registered_after_the_training_step_was_traced_is_refused():
    layer = _layer()
    tf.function(lambda k: layer(k, training=True))(_keys(1))
    with pytest.raises(RuntimeError, match="build the optimizer first"):
        sharding.SparseAdagrad(0.1).build(layer.trainable_variables)


def _trained_checkpoint(tmp_path):
    model, optimizer, step = _trainer()
    for keys in _BATCHES[:16]:
        step(keys)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    return model, path


@pytest.mark.parametrize("num_shards", [3, 1])
def test_a_checkpoint_of_two_shards_restores_onto_other_shard_counts_with_the_same_lookups(
    tmp_path, num_shards
):
    model, path = _trained_checkpoint(tmp_path)
    # Room for every key on whichever shard it hashes to.
    restored, optimizer, _ = _trainer(num_shards=num_shards, capacity=24)
    tf.train.Checkpoint(model=restored, optimizer=optimizer).restore(path).assert_consumed()
    probe = np.array([[k, k + 1] for k in range(0, 120, 3)], np.int64)  # seen and unseen keys
    np.testing.assert_allclose(model(probe).numpy(), restored(probe).numpy(), rtol=0, atol=1e-6)
    before, after = sharding.dynamic_table_stats(model), sharding.dynamic_table_stats(restored)
    for name in ("rows_in_use", "admitted", "evicted", "expired"):
        assert after[f"ids/{name}"] == before[f"ids/{name}"]
    layer = restored.get_layer("ids")
    keys = np.concatenate([s.key_rows.hash_table.export()[0].numpy().ravel() for s in layer.shards])
    keys = keys[keys > -(2**63) + 1]
    for shard_index, shard in enumerate(layer.shards):  # every key on the shard it hashes to
        mine = keys[dynamic_keys.shard_of(tf.constant(keys), num_shards).numpy() == shard_index]
        assert (shard.key_rows.lookup(tf.constant(mine, tf.int64)).numpy() >= 0).all()
    # The slots moved with their keys: a training step from here matches one from the original.
    original_slots = {
        int(k): r
        for s in model.get_layer("ids").shards
        for k, r in zip(s.row_key.numpy(), _slot_rows(s))
    }
    moved_slots = {
        int(k): r for s in layer.shards for k, r in zip(s.row_key.numpy(), _slot_rows(s))
    }
    for key, row in original_slots.items():
        if key in moved_slots:
            np.testing.assert_array_equal(moved_slots[key], row)
    assert set(original_slots) == set(moved_slots)


def _slot_rows(shard) -> np.ndarray:
    ((_, slot),) = shard.slots
    return slot.numpy()


def test_a_restore_onto_shards_too_small_keeps_the_most_used_keys_and_counts_the_rest_evicted(
    tmp_path,
):
    model, path = _trained_checkpoint(tmp_path)
    before = sharding.dynamic_table_stats(model)
    restored = _model(num_shards=1, capacity=3)
    with mock.patch.object(dynamic_checkpoint.logging, "info") as said:
        tf.train.Checkpoint(model=restored).read(path).expect_partial()
    after = sharding.dynamic_table_stats(restored)
    assert after["ids/rows_in_use"] == 3
    dropped = int(before["ids/rows_in_use"]) - 3
    assert after["ids/evicted"] == before["ids/evicted"] + dropped
    # The re-sharding is said, with the keys it dropped.
    (line,) = [call.args[1] for call in said.call_args_list]
    saved = int(before["ids/rows_in_use"])
    assert line.startswith(f"ids: {saved:,} keys saved on 2 shard(s) re-hashed onto 1; ")
    assert f"{dropped:,} of them dropped (their shards hold 3 rows each" in line
    # The three kept keys are the most frequently seen.
    shard = restored.get_layer("ids").shards[0]
    kept = set(shard.row_key.numpy().tolist())
    seen = {
        int(k): int(f)
        for s in model.get_layer("ids").shards
        for k, f in zip(s.row_key.numpy(), s.eviction.metadata["frequency"].numpy())
        if k > -(2**63)
    }
    assert min(seen[k] for k in kept) >= sorted(seen.values())[-3]


def _two_table_model(num_shards: int) -> keras.Model:
    user = keras.Input((), dtype="int64", name="user")
    item = keras.Input((), dtype="string", name="item")
    initializer = keras.initializers.RandomUniform(-0.5, 0.5, seed=5)
    users = sharding.DynamicEmbedding(
        4, 64, num_shards=num_shards, embeddings_initializer=initializer, name="users"
    )(user)
    items = sharding.DynamicEmbedding(
        4,
        64,
        num_shards=num_shards,
        key_dtype="string",
        min_count=2,
        embeddings_initializer=initializer,
        name="items",
    )(item)
    score = keras.layers.Dot(axes=1, name="score")([users, items])
    return keras.Model({"user": user, "item": item}, score)


def test_a_model_trained_on_two_shards_serves_raw_keys_from_a_clean_process(tmp_path):
    from servinglib import serve_in_clean_process

    from tfdist_trainer.runtime.export import export_serving_model

    rng = np.random.default_rng(0)
    model = _two_table_model(num_shards=2)
    optimizer = sharding.SparseAdagrad(0.2)
    optimizer.build(model.trainable_variables)

    def examples(n, users, items):
        return {
            "user": rng.integers(-(2**62), 2**62, size=users)[rng.integers(0, users, size=n)],
            "item": np.array([f"{x:08x}" for x in rng.integers(0, 2**32, size=items)])[
                rng.integers(0, items, size=n)
            ],
        }

    @tf.function
    def step(features, label):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features, training=True)[:, 0] - label))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    train = examples(1200, 50, 40)
    for i in range(0, 1200, 100):
        batch = {k: tf.constant(v[i : i + 100]) for k, v in train.items()}
        step(batch, tf.ones([100]))
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    # As --mode=export does: a copy built outside the cluster (one shard), restored from the checkpoint.
    copy = _two_table_model(num_shards=1)
    tf.train.Checkpoint(model=copy).read(path).expect_partial()
    export_serving_model(copy, str(tmp_path / "export"))

    seen = {k: v[:700] for k, v in train.items()}
    unseen = examples(300, 300, 300)  # new users and items: the default rows
    probe = {k: np.concatenate([seen[k], unseen[k]]) for k in seen}
    expected = model({k: tf.constant(v) for k, v in probe.items()}).numpy()
    # The signature's output is named after the model's output layer ("score"), not output_0.
    served, ops = serve_in_clean_process(str(tmp_path / "export"), probe, output="score")
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    assert np.abs(expected[:700] - expected[700:].mean()).max() > 1e-3  # the rows were trained
    assert "LookupTableFindV2" in ops and "Fingerprint" in ops


@pytest.mark.parametrize("min_count", [1, 2])
def test_a_long_run_of_new_keys_keeps_the_hash_tables_usable(min_count):
    # TF's DenseHashTable never frees a removed key's bucket by itself: without the rebuilds, a
    # stream of evictions (min_count=1) or forgotten candidates (2) used up the empty buckets and
    # a lookup failed ("Internal error in MutableDenseHashTable lookup") after a few hundred steps.
    layer = _layer(capacity=64, min_count=min_count)
    shard = layer.shards[0]
    step = tf.function(lambda keys: layer(keys, training=True))
    rng = np.random.default_rng(0)
    for _ in range(600):
        step(tf.constant(np.concatenate([rng.integers(0, 16, 16), rng.integers(1, 2**62, 24)])))
    for table in filter(None, [shard.key_rows, shard.admission.candidates]):
        keys = table.hash_table.export()[0].numpy().ravel()
        assert (keys == -(2**63) + 1).sum() * 4 < keys.size  # deleted buckets: under a quarter
    stats = _stats(layer)
    assert stats["rows_in_use"] <= 64 and (stats["evicted"] > 1000 or min_count == 2)
    assert all(_row(layer, k) >= 0 for k in range(16))  # the frequent keys keep their rows


def test_stacked_features_are_key_spaces_of_their_own_with_a_default_row_each():
    layer = _layer(capacity=16, stacked_features=3)
    assert layer.default_row.shape == (3, 4)
    keys = tf.constant([[5, 5, 5], [5, 6, 7]], tf.int64)  # key 5 in each of the 3 features
    out = layer(keys, training=True).numpy()
    assert out.shape == (2, 3, 4)
    assert _stats(layer)["rows_in_use"] == 5  # (0,5) (1,5) (2,5) (1,6) (2,7)
    assert not np.allclose(out[0, 0], out[0, 1]) and not np.allclose(out[0, 1], out[0, 2])
    np.testing.assert_array_equal(out[0, 0], out[1, 0])  # one (feature, key): one row
    # Unseen keys read their feature's default row (and train it).
    unseen = layer(tf.constant([[100, 101, 102]], tf.int64)).numpy()
    np.testing.assert_array_equal(unseen[0], layer.default_row.numpy())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(
            layer(tf.constant([[100, 5, 102]], tf.int64)) * [[[1.0], [2.0], [3.0]]]
        )
    grads = dict(
        zip(
            [v.name for v in layer.trainable_variables],
            tape.gradient(loss, layer.trainable_variables),
        )
    )
    default_grad = tf.convert_to_tensor(grads["default_row"]).numpy()
    np.testing.assert_array_equal(default_grad[:, 0], [1.0, 0.0, 3.0])  # feature 1's key has a row


def test_string_and_int64_features_stack_in_one_table_each_in_its_own_key_space():
    # String user ids and int64 item ids, one table: keys as a list of one tensor per feature.
    layer = _layer(capacity=16, stacked_features=2, key_dtype=["string", "int64"])
    users = tf.constant(["42", "ab12", "42"])
    items = tf.constant([42, 7, 9], tf.int64)
    out = layer([users, items], training=True).numpy()
    assert out.shape == (3, 2, 4)
    assert _stats(layer)["rows_in_use"] == 5  # users "42", "ab12"; items 42, 7, 9
    np.testing.assert_array_equal(out[0, 0], out[2, 0])  # one user, one row
    assert not np.allclose(out[0, 0], out[0, 1])  # user "42" and item 42 are two keys
    again = layer([tf.constant(["ab12"]), tf.constant([7], tf.int64)]).numpy()
    np.testing.assert_array_equal(again[0], out[1])  # inference reads the rows training made
    assert layer.get_config()["key_dtype"] == ["string", "int64"]


@pytest.mark.parametrize(
    "kwargs, keys, fragment",
    [
        (
            {"key_dtype": ["string", "int64"]},
            None,
            "a key_dtype per feature needs stacked_features",
        ),
        (
            {"key_dtype": ["string", "int64"], "stacked_features": 2},
            tf.constant([[1, 2]], tf.int64),
            "needs the keys as a list of 2 tensors, one per feature",
        ),
        (
            {"key_dtype": ["string", "int64"], "stacked_features": 2},
            [tf.constant([1], tf.int64), tf.constant([2], tf.int64)],
            "key_dtype='string' but the keys are int64",
        ),
        (
            {"stacked_features": 3},
            [tf.constant([1], tf.int64), tf.constant([2], tf.int64)],
            "keys as a list of 2 tensors need stacked_features=2",
        ),
    ],
)
def test_mixed_key_type_mistakes_are_one_sentence(kwargs, keys, fragment):
    with pytest.raises(ConfigError, match=fragment):
        layer = _layer(capacity=16, **kwargs)
        layer(keys, training=True)


def test_stacked_keys_need_one_key_of_each_feature_on_the_last_axis():
    layer = _layer(stacked_features=3)
    with pytest.raises(
        ConfigError,
        match=r"stacked_features=3 needs keys whose last axis holds one key of each of the 3 features",
    ):
        layer(tf.constant([[1, 2]], tf.int64), training=True)


def test_a_stacked_table_trained_on_two_shards_restores_onto_one_with_the_same_lookups(tmp_path):
    def stacked(shards):
        layer = _layer(capacity=64, stacked_features=2, num_shards=shards, key_dtype="string")
        return layer

    layer = stacked(2)
    optimizer = sharding.SparseAdagrad(0.2)
    optimizer.build(layer.trainable_variables)
    rng = np.random.default_rng(0)
    keys = np.array([f"{x:06x}" for x in rng.integers(0, 2**24, size=40)])[
        rng.integers(0, 40, size=(200, 2))
    ]
    for i in range(0, 200, 20):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(
                tf.square(layer(tf.constant(keys[i : i + 20]), training=True) - 1.0)
            )
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
    copy = stacked(1)
    tf.train.Checkpoint(layer=copy).read(path).expect_partial()
    probe = tf.constant(np.concatenate([keys[:50], [["new-a", "new-b"]]]))
    np.testing.assert_allclose(copy(probe).numpy(), layer(probe).numpy(), rtol=0, atol=1e-6)
    assert _stats(copy)["rows_in_use"] == _stats(layer)["rows_in_use"] > 40
