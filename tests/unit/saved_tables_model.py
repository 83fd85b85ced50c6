"""A Keras model holding every public table layer of the library, trained a few steps: the model
behind `fixtures/tables_model.keras`, the `.keras` file that `test_keras_saving.py` loads.

The file was written once (`python tests/unit/saved_tables_model.py`) and is committed as it was:
a file saved by an earlier version of the library must keep loading (and predicting the same)
after its modules move or its layers change. Regenerate it only for a deliberate format break.
"""

from __future__ import annotations

import os

import keras
import keras_rs
import numpy as np
import tensorflow as tf

from tfdist_trainer import sharding

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tables_model.keras")
PROBE = os.path.join(os.path.dirname(FIXTURE), "tables_model_probe.npz")


def build() -> keras.Model:
    """Ids into a fixed table, two more fixed tables read as a group, string keys into a growing
    table, two keras-rs features sharing a table through the bridge (one reduced by 'mean'), all
    into a sharded softmax over 40 classes."""
    ids = keras.Input(shape=(), dtype="int64", name="item")
    user = keras.Input(shape=(), dtype="string", name="user")
    item = sharding.ShardedEmbedding(100, 4, num_shards=2, name="items")(ids)
    group = sharding.EmbeddingGroup(
        [
            sharding.ShardedEmbedding(30, 4, num_shards=3, name="brands"),
            sharding.ShardedEmbedding(30, 4, num_shards=2, partition_strategy="mod", name="shops"),
        ],
        name="item_side",
    )([ids, ids])
    users = sharding.DynamicEmbedding(4, 64, num_shards=2, key_dtype="string", name="users")(user)
    shared = keras_rs.layers.TableConfig(name="item_ids", vocabulary_size=30, embedding_dim=4)
    bridged = sharding.from_keras_rs(
        {
            "item": keras_rs.layers.FeatureConfig("item", shared, (None,), (None, 4)),
            "pair": keras_rs.layers.FeatureConfig("pair", shared, (None, 2), (None, 4)),
        },
        num_shards=2,
        name="keras_rs_tables",
    )({"item": ids, "pair": keras.ops.stack([ids, (ids + 1) % 30], axis=1)})
    hidden = keras.layers.Concatenate()([item, *group, users, bridged["item"], bridged["pair"]])
    logits = sharding.ShardedSoftmax(40, num_shards=2, name="next_item")(hidden)
    return keras.Model({"item": ids, "user": user}, logits)


def probe_inputs() -> dict[str, np.ndarray]:
    """Inputs seen in training and unseen ones (new user keys: the table's default rows)."""
    return {
        "item": np.arange(0, 64, dtype=np.int64) % 30,
        "user": np.array([f"user-{i % 40}" for i in range(64)]),
    }


def trained() -> keras.Model:
    model = build()
    optimizer = sharding.SparseAdagrad(0.3)
    optimizer.build(model.trainable_variables)  # before the step is traced (DynamicEmbedding)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    for _ in range(5):
        features = {
            "item": rng.integers(0, 30, 32),
            "user": np.array([f"user-{i}" for i in rng.integers(0, 20, 32)]),
        }
        model.train_on_batch(features, rng.integers(0, 40, 32))
    return model


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    model = trained()
    model.save(FIXTURE)
    probe = probe_inputs()
    outputs = model({k: tf.constant(v) for k, v in probe.items()}).numpy()
    np.savez(PROBE, outputs=outputs, **probe)
    print(f"wrote {FIXTURE} and {PROBE}")
