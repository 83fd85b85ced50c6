"""DynamicEmbedding under parameter_server on a real local cluster: a chief, 2 workers and 2 ps,
each `tf.distribute.Server` its own process on 127.0.0.1. Two workers racing on the same new keys
end with exactly one row per key; SparseAdagrad training lowers the loss and updates only the rows
the batches used; a keras-rs model (DotInteraction) over stacked features trains on the 2 ps."""

from __future__ import annotations

import pytest
from test_tf_compat import run_script

pytestmark = pytest.mark.cluster

SCRIPT = """
import json, multiprocessing, os, sys, time

started = time.monotonic()
phases = []
def phase(name):  # where the time went (importing TensorFlow in 5 processes, mostly)
    phases.append(f"{time.monotonic() - started:.1f}s {name}")

from tfdist_trainer.launch.ports import pick_port

def serve(cluster, job, index):
    import tensorflow as tf
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                         protocol="grpc", start=True).join()

ports = []
for _ in range(5):
    ports.append(pick_port(set(ports)))
cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
           "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
           "ps": [f"127.0.0.1:{p}" for p in ports[3:5]]}
servers = []
for job in ("worker", "ps"):  # before TensorFlow is imported here: a clean fork
    for index in range(len(cluster[job])):
        servers.append(multiprocessing.Process(target=serve, args=(cluster, job, index), daemon=True))
        servers[-1].start()

import numpy as np
import tensorflow as tf
from tfdist_trainer import sharding
from tfdist_trainer.sharding.dynamic.keys import DELETED_KEY

resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
phase("connected")
with strategy.scope():
    layer = sharding.DynamicEmbedding(
        4, 1024, embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=0),
        name="ids")
    layer.build(None)
    optimizer = sharding.SparseAdagrad(0.5)
    optimizer.build(layer.trainable_variables)
out = {"shards": [[s.pool.value.device, s.key_rows.hash_table.resource_handle.device,
                   s.row_key.device] for s in layer.shards]}

def table(shard):
    keys, rows = (t.numpy().reshape(-1) for t in shard.key_rows.hash_table.export())
    used = keys > DELETED_KEY
    return keys[used], rows[used]

# The race: both workers get every batch of new keys at once (each key twice in a batch).
@tf.function
def race(base):
    return layer(base + tf.range(200, dtype=tf.int64) // 2, training=True)

for r in range(10):
    for _ in range(2):
        coordinator.schedule(race, args=(tf.constant(r * 50, tf.int64),))
coordinator.join()
phase("raced")
keys = [table(s)[0] for s in layer.shards]
rows = [table(s)[1] for s in layer.shards]
out["race"] = {
    "keys": sorted(int(k) for part in keys for k in part),
    "rows_unique": [len(set(r.tolist())) == len(r) for r in rows],
    "rows_in_use": [int(s.rows_in_use.numpy()) for s in layer.shards],
    "keys_per_shard": [len(k) for k in keys],
    "stats": sharding.dynamic_table_stats(layer),
}

# Training: keys 1000..1063, the target of a key is its parity.
before = [s.pool.numpy().copy() for s in layer.shards]

def train_replica(step):
    keys = 1000 + (step * 7 + tf.range(32, dtype=tf.int64)) % 64
    target = tf.cast(keys % 2, tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(layer(keys, training=True), -1) - target))
    gradients = tape.gradient(loss, layer.trainable_variables)
    optimizer.apply(gradients, layer.trainable_variables)
    return loss

@tf.function
def train(step):
    return strategy.run(train_replica, args=(step,))

losses = [coordinator.schedule(train, args=(tf.constant(i, tf.int64),)) for i in range(20)]
coordinator.join()
phase("trained")
losses = [float(l.fetch()) for l in losses]
changed, trained = [], []
for shard, old in zip(layer.shards, before):
    shard_keys, shard_rows = table(shard)
    changed.append(sorted(np.nonzero(np.any(shard.pool.numpy() != old, axis=1))[0].tolist()))
    trained.append(sorted(int(r) for k, r in zip(shard_keys, shard_rows) if k >= 1000))
out["train"] = {"first": float(np.mean(losses[:5])), "last": float(np.mean(losses[-5:])),
                "changed": changed, "trained": trained}

# A keras-rs model over stacked features: 3 features as one table (stacked_features), their
# vectors crossed by keras-rs' DotInteraction, trained by both workers on the 2 ps.
import keras
import keras_rs
with strategy.scope():
    stacked = sharding.DynamicEmbedding(
        4, 512, stacked_features=3, name="stacked",
        embeddings_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1, seed=1))
    interaction = keras_rs.layers.DotInteraction(self_interaction=False)
    head = keras.layers.Dense(1, name="head")
    stacked.build(None)
    head.build((None, 3))
    weights = stacked.trainable_variables + head.trainable_variables
    rs_optimizer = sharding.SparseAdagrad(0.3)
    rs_optimizer.build(weights)

def rs_replica(step):
    ids = (step * 5 + tf.range(48, dtype=tf.int64)) % 40
    keys = tf.stack([ids, ids, (ids * 3) % 40], axis=1)  # the same ids in features 0 and 1
    target = tf.cast(ids % 2, tf.float32)
    with tf.GradientTape() as tape:
        vectors = stacked(keys, training=True)
        crossed = interaction(tf.unstack(vectors, axis=1))
        loss = tf.reduce_mean(tf.square(head(crossed)[:, 0] - target))
    rs_optimizer.apply(tape.gradient(loss, weights), weights)
    return loss

@tf.function
def rs_train(step):
    return strategy.run(rs_replica, args=(step,))

rs_losses = [coordinator.schedule(rs_train, args=(tf.constant(i, tf.int64),)) for i in range(30)]
coordinator.join()
phase("keras-rs on stacked features")
rs_losses = [float(l.fetch()) for l in rs_losses]
stats = sharding.dynamic_table_stats(stacked)
out["stacked"] = {"first": float(np.mean(rs_losses[:5])), "last": float(np.mean(rs_losses[-5:])),
                  "rows_in_use": stats["stacked/rows_in_use"],
                  "per_shard": [stats[f"stacked/shard_{i}/rows_in_use"] for i in range(2)],
                  "default_rows": list(stacked.default_row.shape)}
# A stale update: a step reads keys 1..8 (every row of one 1-shard table), then, before its
# update, a later call meets keys 11..18, evicting 1..8 and giving their rows to the new keys.
# The update (run in the shard's critical section on the ps) must leave the new rows as drawn.
with strategy.scope():
    small = sharding.DynamicEmbedding(4, 8, num_shards=1, embeddings_initializer="ones",
                                      name="small")
    small.build(None)
    small_optimizer = sharding.SparseAdagrad(0.5)
    small_optimizer.build(small.trainable_variables)

def stale_replica():
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(small(tf.range(1, 9, dtype=tf.int64), training=True))
    gradients = tape.gradient(loss, small.trainable_variables)
    with tf.control_dependencies([tf.nest.flatten(gradients, expand_composites=True)[0]]):
        later = small(tf.range(11, 19, dtype=tf.int64), training=True)
    with tf.control_dependencies([later]):
        small_optimizer.apply(gradients, small.trainable_variables)
    return loss

@tf.function
def stale_step():
    return strategy.run(stale_replica)

coordinator.schedule(stale_step)
coordinator.join()
out["stale"] = {"pool": small.shards[0].pool.numpy().tolist(),
                "old_keys_rows": small.shards[0].lookup(tf.range(1, 9, dtype=tf.int64)).numpy().tolist()}
out["phases"] = ", ".join(phases)
print(json.dumps(out), flush=True)
for server in servers:  # they hold the test's stdout pipe open
    server.kill()
os._exit(0)  # the coordinator cannot be shut down cleanly
"""


def test_two_workers_racing_on_new_keys_and_sparse_training_on_two_ps(tmp_path):
    result = run_script(tmp_path, SCRIPT, timeout=150)
    print(f"cluster script: {result['phases']}")

    # Each shard's state lives on its own ps task: the pool, the hash table, the bookkeeping.
    for devices in result["shards"]:
        assert len({d.split("/device:")[0] for d in devices}) == 1, devices
        assert "/job:ps/" in devices[0], devices
    assert {d[0].split("/device:")[0] for d in result["shards"]} == {
        "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1",
    }

    race = result["race"]
    assert race["keys"] == list(range(550))  # bases 0..450 step 50, each with 100 keys
    assert all(race["rows_unique"]), race
    assert race["rows_in_use"] == race["keys_per_shard"], race
    assert min(race["keys_per_shard"]) > 200, race  # the hash spreads the keys over both shards
    assert race["stats"]["ids/rows_in_use"] == 550 and race["stats"]["ids/admitted"] == 550

    train = result["train"]
    assert train["last"] < 0.5 * train["first"], train
    assert train["changed"] == train["trained"], train  # only the rows the batches used moved
    assert sum(len(t) for t in train["trained"]) == 64

    # Stacked features under parameter_server: features 0 and 1 see the same 40 ids and get a
    # row each (120 keys in all), spread over both ps; a keras-rs model on them trains.
    stacked = result["stacked"]
    assert stacked["rows_in_use"] == 120 and min(stacked["per_shard"]) > 30, stacked
    assert stacked["default_rows"] == [3, 4], stacked
    assert stacked["last"] < stacked["first"], stacked

    # An update computed before a later lookup gave its rows to other keys never lands on them.
    stale = result["stale"]
    assert stale["old_keys_rows"] == [-1] * 8, stale
    assert stale["pool"] == [[1.0] * 4] * 8, stale
