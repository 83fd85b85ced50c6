"""The click recipe's raw keys, in process: the synthetic open id space (new ids as batches
advance, a repeating head, ids over the whole int64 range, a pure function of (seed, batch)),
hidden weights for any int64 id, hex-string ids, Criteo's categoricals kept as raw strings, and
ClickTrainer with string keys on dynamic tables (and fixed tables hashing raw ids) training."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recipes.sharded_embedding import data as click_data

VOCAB = [3000, 50]


def _open(**kwargs) -> click_data.SyntheticClicks:
    return click_data.SyntheticClicks(VOCAB, num_dense=4, seed=5, id_space="open", **kwargs)


def _ids(generator, batches, batch_size=256) -> np.ndarray:
    ids = tf.function(lambda b: generator.ids(b, batch_size))
    return np.concatenate([ids(tf.constant(b, tf.int64)).numpy() for b in batches])


def test_the_open_id_space_keeps_a_head_and_brings_new_ids_as_batches_advance():
    generator = _open()
    early, late = _ids(generator, range(0, 20)), _ids(generator, range(400, 420))
    for f in range(len(VOCAB)):
        seen_early, seen_late = set(early[:, f].tolist()), set(late[:, f].tolist())
        # a head that repeats: the 10 most frequent ids of each window are shared ...
        top = [set(k for k, _ in _top(ids[:, f], 10)) for ids in (early, late)]
        assert len(top[0] & top[1]) >= 8, (f, top)
        # ... and new ids keep appearing: the tail (a quarter of the draws), and rare head ids
        new = [i for i in late[:, f] if i not in seen_early]
        assert 0.2 < len(new) / len(late) < (0.3 if VOCAB[f] < 100 else 0.6), (f, len(new))
        assert len(seen_late - seen_early) > 0.15 * len(late)
    # the tail is seen about once: most tail ids of a window of 300 batches are seen once or twice
    window = _ids(generator, range(100, 400), batch_size=128)[:, 0]
    _, counts = np.unique(window, return_counts=True)
    assert np.mean(counts == 1) > 0.3 and np.mean(counts <= 2) > 0.5, np.bincount(counts)[:5]


def _top(values: np.ndarray, n: int) -> list[tuple[int, int]]:
    keys, counts = np.unique(values, return_counts=True)
    order = np.argsort(-counts)[:n]
    return list(zip(keys[order].tolist(), counts[order].tolist()))


def test_open_ids_span_the_int64_range_and_are_a_pure_function_of_seed_and_batch():
    ids = _ids(_open(), range(10))
    assert ids.dtype == np.int64
    assert ids.min() < -(2**62) and ids.max() > 2**62  # not small numbers: the whole range
    assert np.mean(ids < 0) == pytest.approx(0.5, abs=0.1)
    assert ids.min() > -(2**63) + 1  # never a hash table's reserved keys
    assert not set(ids[:, 0].tolist()) & set(ids[:, 1].tolist())  # features do not share ids

    np.testing.assert_array_equal(_open().ids(7, 64), _open().ids(7, 64))
    np.testing.assert_array_equal(
        _open().ids(tf.constant(7, tf.int64), 64), _ids(_open(), [7], batch_size=64)
    )
    assert not np.array_equal(_open().ids(7, 64), _open().ids(8, 64))
    other_seed = click_data.SyntheticClicks(VOCAB, num_dense=4, seed=6, id_space="open")
    assert not np.array_equal(_open().ids(7, 64), other_seed.ids(7, 64))
    first, again = (list(_open().dataset(32, num_batches=3)) for _ in range(2))
    for (f1, l1), (f2, l2) in zip(first, again):
        np.testing.assert_array_equal(f1["categorical"], f2["categorical"])
        np.testing.assert_array_equal(l1, l2)
        np.testing.assert_array_equal(f1["dense"], f2["dense"])


def test_the_fixed_id_space_is_unchanged_by_default():
    fixed = click_data.SyntheticClicks(VOCAB, num_dense=4, seed=5)
    ids = _ids(fixed, range(5))
    assert fixed.id_space == "fixed" and ids.min() >= 0
    assert ids[:, 0].max() < VOCAB[0] and ids[:, 1].max() < VOCAB[1]
    features, _ = fixed.batch(3, 16)
    np.testing.assert_array_equal(features["categorical"], fixed.ids(3, 16))


def test_hidden_weights_are_defined_for_any_int64_id():
    values = tf.constant([-(2**63), -1, 0, 5, 5 + 2147483647, 2**62, 2**63 - 1], tf.int64)
    u = click_data.hash_uniform(5, 1001, values).numpy()
    assert np.all((u > 0) & (u < 1)), u
    assert len(set(u.tolist())) == len(u)  # high bits count: 5 and 5 + (2^31 - 1) differ
    # ids below 2^31 - 1 keep the weights they always had
    small = tf.constant([0, 1, 12345, 2147483646], tf.int64)
    x = (small * 40503 + (1001 * 7919 + 5 * 104729 + 1) % 2147483647) % 2147483647 + 1
    expected = (click_data._mix(x).numpy().astype(np.float64) + 0.5) / 2147483647
    np.testing.assert_allclose(click_data.hash_uniform(5, 1001, small).numpy(), expected)
    # a signal to learn: the oracle separates clicks on the open space
    generator = _open()
    auc = tf.keras.metrics.AUC(from_logits=True)
    for b in range(8):
        features, labels = generator.batch(b, 256)
        auc.update_state(labels, generator.oracle_logits(features))
    assert 0.65 < float(auc.result()) < 0.95


def test_string_keys_are_the_ids_as_16_hex_digits():
    ints, strings = _open(), _open(key_dtype="string")
    ids = ints.ids(3, 8).numpy()
    features, labels = strings.batch(3, 8)
    assert features["categorical"].dtype == tf.string
    expected = [[f"{int(i) & (2**64 - 1):016x}".encode() for i in row] for row in ids]
    assert features["categorical"].numpy().tolist() == expected
    np.testing.assert_array_equal(click_data.ids_from_hex(features["categorical"]), ids)
    np.testing.assert_array_equal(labels, ints.batch(3, 8)[1])  # the same clicks
    np.testing.assert_allclose(
        strings.oracle_logits(features), ints.oracle_logits(ints.features(3, 8))
    )


def _criteo_line(label: int, dense: list, categorical: list[str]) -> str:
    """One Criteo TSV line: label, 13 integers (empty: missing), 26 categoricals (empty: missing)."""
    return "\t".join([str(label), *map(str, dense), *categorical])


def test_criteo_categoricals_can_stay_raw_strings(tmp_path):
    rows = [
        _criteo_line(1, [5, "", 3, -1] + [0] * 9, ["68fd1e64", "", *["aa"] * 24]),
        _criteo_line(0, [1] * 13, ["05db9164"] * 26),
    ]
    (tmp_path / "day_0.tsv").write_text("\n".join(rows) + "\n")
    path, vocab = tmp_path / "day_0.tsv", [1000] * 26
    ((features, labels),) = list(
        click_data.criteo_dataset(str(path), 2, vocab, training=False, key_dtype="string")
    )
    np.testing.assert_array_equal(labels.numpy(), [[1.0], [0.0]])
    categorical = features["categorical"].numpy()
    assert features["categorical"].dtype == tf.string and categorical.shape == (2, 26)
    assert categorical[0, :3].tolist() == [b"68fd1e64", b"", b"aa"]  # empty: missing
    assert set(categorical[1].tolist()) == {b"05db9164"}
    hashed = click_data.parse_criteo_lines(tf.constant(rows), vocab)[0]["categorical"]
    assert int(hashed[0, 0]) == int(tf.strings.to_hash_bucket_fast("68fd1e64", 1000))
    with pytest.raises(ValueError, match="key_dtype must be 'int64' or 'string'"):
        click_data.parse_criteo_lines(tf.constant(rows), vocab, key_dtype="bytes")


@pytest.mark.parametrize(
    "key_dtype,capacity", [("string", 400), ("int64", None)], ids=["dynamic_string", "fixed"]
)
def test_click_trainer_trains_on_raw_keys_in_process(key_dtype, capacity):
    """String keys into dynamic tables; raw int64 ids hashed into fixed tables (BucketHash)."""
    from recipes.sharded_embedding.trainer import BucketHash, ClickTrainer
    from tfdist_trainer import sharding
    from tfdist_trainer.runtime import state as state_lib
    from tfdist_trainer.trainers import data as data_lib

    trainer = ClickTrainer(
        vocab_sizes=[300, 40],
        embedding_dim=4,
        num_shards=2,
        hidden_units=(8,),
        learning_rate=0.1,
        id_space="open",
        key_dtype=key_dtype,
        dynamic_capacity=capacity,
        min_count=2,
        global_batch_size=64,
        eval_batches=1,
    )
    state_lib.build_state(trainer, tf.distribute.get_strategy())
    assert trainer.model.input["categorical"].dtype == key_dtype
    hashes = [layer for layer in trainer.model.layers if isinstance(layer, BucketHash)]
    assert len(hashes) == (2 if capacity is None else 0)
    batches = iter(trainer.build_train_dataset(data_lib.single_pipeline_context()))
    features, labels = next(batches)
    assert features["categorical"].dtype == key_dtype and labels.shape == (64, 1)
    step = tf.function(trainer.train_step)
    losses = [float(step(next(batches))) for _ in range(25)]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]), losses
    stats = sharding.dynamic_table_stats(trainer.model)
    if capacity is None:
        assert stats == {}
    else:
        assert 0 < stats["table_0/rows_in_use"] <= capacity and stats["table_1/admitted"] > 0
    (eval_features, _), *_ = list(trainer.build_eval_dataset(data_lib.single_pipeline_context()))
    assert trainer.model(eval_features, training=False).shape == (64, 1)


def test_bucket_hash_is_a_stable_fingerprint_mod_the_rows():
    from recipes.sharded_embedding.trainer import BucketHash

    ids = tf.constant([[-(2**63) + 5, 0], [2**63 - 1, 12345]], tf.int64)
    rows = BucketHash(97)(ids).numpy()
    assert rows.shape == (2, 2) and rows.min() >= 0 and rows.max() < 97
    flat = tf.bitcast(tf.fingerprint(tf.reshape(ids, [-1])), tf.int64).numpy()
    np.testing.assert_array_equal(rows.reshape(-1), np.mod(flat, 97))
    strings = BucketHash(97)(tf.constant(["68fd1e64", "", "68fd1e64"])).numpy()
    assert strings[0] == strings[2] and strings.max() < 97


def test_click_trainer_refuses_an_unknown_id_space_or_key_dtype():
    from recipes.sharded_embedding.trainer import ClickTrainer

    with pytest.raises(ValueError, match="ClickTrainer.id_space must be 'fixed' or 'open'"):
        ClickTrainer(id_space="closed")
    with pytest.raises(ValueError, match="key_dtype 'int64' or 'string'"):
        ClickTrainer(key_dtype="bytes")
