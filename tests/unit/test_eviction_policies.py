"""Eviction as a policy: LFU (the default) and LRU free different rows of a full shard, the layer
saves its policy's name, a restore onto smaller shards keeps the keys its policy ranks highest,
and the click recipe selects the policy by gin."""

from __future__ import annotations

import gin
import keras
import pytest
import tensorflow as tf

from tfdist_trainer import sharding
from tfdist_trainer.sharding.dynamic.eviction import LFUEviction, LRUEviction

# Key 1 is seen often but long ago; keys 2, 3, 4 once each since, in that order.
_STEPS = [(1, 2, 3, 4), (1,), (1,), (1,), (2,), (3,), (4,)]


def _layer(eviction: str | None, capacity: int = 4) -> sharding.DynamicEmbedding:
    kwargs = {} if eviction is None else {"eviction": eviction}
    layer = sharding.DynamicEmbedding(
        2, capacity, embeddings_initializer=keras.initializers.Zeros(), name="ids", **kwargs
    )
    layer.build(None)
    return layer


def _has_row(layer, key: int) -> bool:
    return int(layer.shards[0].key_rows.lookup(tf.constant([key], tf.int64))[0]) >= 0


def _train(layer, steps) -> None:
    for keys in steps:
        layer(tf.constant(keys, tf.int64), training=True)


@pytest.mark.parametrize(
    "eviction, freed", [(None, 2), ("lfu", 2), ("lru", 1)], ids=["default", "lfu", "lru"]
)
def test_a_full_shard_frees_the_row_its_policy_scores_lowest(eviction, freed):
    # A shard of 4 rows frees one row for key 5: LFU the least frequent (keys 2, 3, 4 seen twice,
    # 2 the longest ago), LRU the least recently seen (key 1, however often it was seen).
    layer = _layer(eviction)
    _train(layer, [*_STEPS, (5,)])
    assert [k for k in (1, 2, 3, 4, 5) if not _has_row(layer, k)] == [freed]
    assert sharding.dynamic_table_stats(layer)["ids/evicted"] == 1


def test_the_policy_owns_its_metadata_and_the_layer_saves_its_name():
    lfu, lru = _layer("lfu"), _layer("lru")
    assert isinstance(lfu.shards[0].eviction, LFUEviction)
    assert isinstance(lru.shards[0].eviction, LRUEviction)
    assert list(lfu.shards[0].eviction.metadata) == ["frequency"]
    assert lru.shards[0].eviction.metadata == {}  # LRU ranks by the shard's last sighting alone
    assert len(lru.shards[0].state_variables()) == len(lfu.shards[0].state_variables()) - 1
    assert sharding.DynamicEmbedding.from_config(lru.get_config()).eviction == "lru"


def test_a_restore_onto_a_smaller_shard_keeps_the_keys_the_policy_ranks_highest(tmp_path):
    for eviction, kept in (("lfu", {1, 3, 4}), ("lru", {3, 4, 5})):
        # Saved with 5 rows: key 1 often and long ago, then 2, 3, 4 (4 twice) and 5 once more.
        layer = _layer(eviction, capacity=5)
        _train(layer, [*_STEPS, (4,), (5,)])
        path = tf.train.Checkpoint(table=layer).write(str(tmp_path / eviction))
        small = _layer(eviction, capacity=3)
        tf.train.Checkpoint(table=small).read(path).assert_consumed()
        assert {k for k in (1, 2, 3, 4, 5) if _has_row(small, k)} == kept, eviction


def test_the_click_recipe_selects_the_policy_by_gin():
    from recipes.sharded_embedding.trainer import ClickTrainer
    from tfdist_trainer.runtime import state as state_lib

    with gin.unlock_config():
        gin.parse_config(
            [
                "ClickTrainer.vocab_sizes = [40, 30]",
                "ClickTrainer.embedding_dim = 2",
                "ClickTrainer.hidden_units = (4,)",
                "ClickTrainer.id_space = 'open'",
                "ClickTrainer.dynamic_capacity = 16",
                "ClickTrainer.global_batch_size = 8",
                "ClickTrainer.eviction = 'lru'",
            ]
        )
    try:
        trainer = ClickTrainer()
        state_lib.build_state(trainer, tf.distribute.get_strategy())
    finally:
        gin.clear_config()
    tables = [
        layer for layer in trainer.model.layers if isinstance(layer, sharding.DynamicEmbedding)
    ]
    assert tables and all(isinstance(t.shards[0].eviction, LRUEviction) for t in tables)
