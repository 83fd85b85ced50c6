"""Sharded tables read once per ps task and differentiated at their rows (`sharding.lookup_together`,
`tfdist_trainer.row_gradients`), through the public API under a real ParameterServerStrategy on
in-process servers (a chief, a worker, 2 ps on 127.0.0.1).

The Trainer's `compute_gradients` must give the same gradients as a plain tape over the same model
(tables in an `EmbeddingGroup`, shards over both ps and several on one ps, 'div' and 'mod', a
table without `unique`, a frozen table, a table used both inside the group and on its own; and a
keras-rs model bridged by `from_keras_rs`, whose features share a table and are combined), its
traced step must read and split the rows on the ps tasks, and `train_step` must train with them.
A checkpoint holds every table, and under the parameter_server runtime each update reads the
learning rate once (Keras reads it once per variable: one transfer from its ps each).
"""

from __future__ import annotations

import pytest
from test_tf_compat import run_script

pytestmark = pytest.mark.cluster

SCRIPT = """
import json, os, shutil, tempfile
import numpy as np
import tensorflow as tf
import keras
import keras_rs

from tfdist_trainer import Trainer, sharding
from tfdist_trainer.launch.ports import pick_port
from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
from tfdist_trainer.runtime.state import build_state
from tfdist_trainer.runtime.strategies.parameter_server import ParameterServerRuntime

jobs = {"chief": 1, "worker": 1, "ps": 2}
spec = tf.train.ClusterSpec(
    {job: [f"localhost:{pick_port()}" for _ in range(n)] for job, n in jobs.items()})
servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
           for job in ("worker", "ps") for i in range(jobs[job])]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    spec, task_type="chief", task_id=0, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(resolver)
SCRATCH = tempfile.mkdtemp()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
# The chief's runtime, as tfdist-train builds it (its state_built adjusts the optimizer).
runtime = ParameterServerRuntime(ParameterServer(), strategy, coordinator=coordinator)

def init(seed):
    return keras.initializers.RandomNormal(seed=seed)

class GroupTrainer(Trainer):
    def build_model(self):
        a = keras.Input((3,), dtype="int64", name="a")
        b = keras.Input((2,), dtype="int64", name="b")
        wide = sharding.ShardedEmbedding(50, 4, num_shards=3, embeddings_initializer=init(0),
                                         name="wide")
        tables = [
            wide,
            # another width: stacked apart from the others on its ps
            sharding.ShardedEmbedding(7, 6, num_shards=1, embeddings_initializer=init(1),
                                      name="single"),
            sharding.ShardedEmbedding(30, 4, partition_strategy="mod", unique=False,
                                      embeddings_initializer=init(2), name="mod"),
            sharding.ShardedEmbedding(20, 4, embeddings_initializer=init(3), name="frozen"),
        ]
        tables[3].trainable = False
        rows = sharding.EmbeddingGroup(tables, name="group")([a, b % 7, a % 30, b % 20])
        rows.append(wide(b))  # the same table again, outside the group: gradients add up
        x = keras.layers.Concatenate()([keras.layers.Flatten()(r) for r in rows])
        return keras.Model({"a": a, "b": b}, keras.layers.Dense(1, name="head")(x))

    def build_optimizer(self):
        return sharding.SparseAdagrad(0.5)

    def compute_loss(self, labels, predictions):
        return tf.reduce_mean(tf.square(predictions - labels), -1)

class KerasRsTrainer(GroupTrainer):
    def build_model(self):
        shared = keras_rs.layers.TableConfig(name="shared", vocabulary_size=4000, embedding_dim=4,
                                             combiner="mean", initializer=init(4))
        own = keras_rs.layers.TableConfig(name="own", vocabulary_size=9, embedding_dim=6,
                                          initializer=init(5))
        features = {
            "a": keras_rs.layers.FeatureConfig("a", shared, (None, 3), (None, 4)),
            "b": keras_rs.layers.FeatureConfig("b", shared, (None, 2), (None, 4)),
            "c": keras_rs.layers.FeatureConfig("c", own, (None,), (None, 6)),
        }
        a = keras.Input((3,), dtype="int64", name="a")
        b = keras.Input((2,), dtype="int64", name="b")
        rows = sharding.from_keras_rs(features, num_shards=3, name="rs")(
            {"a": a * 7 % 40 * 100, "b": b % 40 * 100, "c": (b[:, 0] + b[:, 1]) % 9})
        x = keras.layers.Concatenate()([rows["a"], rows["b"], rows["c"]])
        return keras.Model({"a": a, "b": b}, keras.layers.Dense(1, name="head")(x))

features = {"a": tf.constant([[1, 2, 2], [49, 0, 17], [5, 5, 5]], tf.int64),
            "b": tf.constant([[3, 3], [19, 40], [0, 1]], tf.int64)}
labels = tf.constant([[1.0], [-1.0], [0.5]])

def dense(gradients):
    return [tf.convert_to_tensor(g) for g in gradients]

def check(trainer_cls):
    trainer = trainer_cls(global_batch_size=3)
    build_state(trainer, strategy, runtime=runtime)
    variables = trainer.model.trainable_variables

    def reference():  # a plain tape over the same model: each table differentiated as a variable
        with tf.GradientTape() as tape:
            predictions = trainer.model(features, training=True)
            loss = trainer.step_loss(features, labels, predictions)
        return dense(tape.gradient(loss, variables))

    def on_replica(fn):
        return tf.function(lambda: strategy.run(fn))

    library = on_replica(lambda: dense(trainer.compute_gradients((features, labels))[1]))
    expected = coordinator.schedule(on_replica(reference)).fetch()
    got = coordinator.schedule(library).fetch()
    worst = max(float(np.max(np.abs(e - g))) for e, g in zip(expected, got))
    graph = library.get_concrete_function().graph
    splits = sorted({op.device.split("/device:")[0] for op in graph.get_operations()
                     if op.type == "SplitV" and "/job:ps" in op.device})
    # The learning rate (a variable on one ps) is read once for all the updates, not once each.
    learning_rate = trainer.optimizer._learning_rate.value.handle
    step_graph = on_replica(lambda: trainer.train_step((features, labels))).get_concrete_function().graph
    inner = {id(e): i for e, i in step_graph.captures}
    lr_reads = sum(op.type == "ReadVariableOp" and op.inputs[0] is inner.get(id(learning_rate))
                   for op in step_graph.get_operations())
    # An id outside its table fails the step, naming the table and its bound.
    errors = []
    for column, bad in ((2, 60), (0, -3)):  # "a" is looked up in "wide" (50 rows)
        broken = dict(features)
        broken["a"] = tf.tensor_scatter_nd_update(features["a"], [[1, column]], [bad * 100])
        try:
            coordinator.schedule(
                on_replica(lambda broken=broken: dense(trainer.compute_gradients((broken, labels))[1]))
            ).fetch()
            errors.append("no error")
        except tf.errors.InvalidArgumentError as e:
            errors.append(e.message)
            try:  # the coordinator raises a failed closure's error once more, at the next call
                coordinator.join()
            except tf.errors.InvalidArgumentError:
                pass
    frozen = [v for v in trainer.model.non_trainable_variables if "_shard_" in v.path]
    before = [v.numpy().copy() for v in frozen]
    step = on_replica(lambda: trainer.train_step((features, labels)))
    losses = [float(coordinator.schedule(step).fetch()) for _ in range(15)]
    # A checkpoint holds the grouped tables (Keras 3 alone does not save a list of sublayers).
    path = tf.train.Checkpoint(model=trainer.model).write(os.path.join(SCRATCH, trainer_cls.__name__))
    fresh = trainer_cls(global_batch_size=3)
    build_state(fresh, strategy)
    tf.train.Checkpoint(model=fresh.model).read(path).assert_existing_objects_matched()
    restored = [np.array_equal(a.numpy(), b.numpy())
                for a, b in zip(trainer.model.weights, fresh.model.weights)]
    return {
        "lr_reads": lr_reads,
        "errors": errors,
        "restored": sum(restored),
        "weights": len(restored),
        "shard_devices": sorted({v.value.device.split("/device:")[0] for v in variables
                                 if "_shard_" in v.path}),
        "variables": len(variables),
        "nonzero": sum(int(np.any(e != 0)) for e in expected),
        "worst": worst,
        "ps_splits": splits,
        "losses": [losses[0], losses[-1]],
        "frozen_kept": all(np.array_equal(v.numpy(), b) for v, b in zip(frozen, before)),
        "frozen": len(frozen),
    }

out = {"group": check(GroupTrainer), "keras_rs": check(KerasRsTrainer)}
shutil.rmtree(SCRATCH)
print(json.dumps(out))
"""

PS_TASKS = ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_script(tmp_path_factory.mktemp("grouped"), SCRIPT, timeout=300)


def test_the_trainer_differentiates_grouped_tables_at_their_rows_exactly(result):
    group = result["group"]
    assert group["shard_devices"] == PS_TASKS, group
    # wide (3 shards), single (1), mod (2), the head's kernel and bias; the frozen table is not.
    assert group["variables"] == 3 + 1 + 2 + 2 and group["frozen"] == 2, group
    assert group["nonzero"] == group["variables"], group
    assert group["worst"] < 1e-6, group
    # The rows were read and their gradient split on each ps task, not on the worker.
    assert group["ps_splits"] == PS_TASKS, group


def test_an_id_outside_its_table_fails_the_step_naming_the_table_and_bound(result):
    too_large, negative = result["group"]["errors"]
    assert "assertion failed: [wide/embeddings: ids must be < 50 (the rows)]" in too_large, (
        too_large
    )
    assert "assertion failed: [wide/embeddings: ids must be >= 0" in negative, negative


def test_each_update_reads_the_learning_rate_once_for_every_variable(result):
    for model in ("group", "keras_rs"):
        assert result[model]["lr_reads"] == 1, result[model]


def test_training_with_row_gradients_lowers_the_loss_and_leaves_frozen_tables(result):
    group = result["group"]
    first, last = group["losses"]
    assert last < 0.5 * first, group
    assert group["frozen_kept"], group


def test_a_checkpoint_restores_every_grouped_and_keras_rs_table(result):
    for model in ("group", "keras_rs"):
        assert result[model]["restored"] == result[model]["weights"] > 0, result[model]


def test_a_keras_rs_model_gets_the_same_gradients_read_per_ps(result):
    rs = result["keras_rs"]
    assert rs["shard_devices"] == PS_TASKS, rs
    assert rs["variables"] == 3 + 3 + 2 and rs["nonzero"] == rs["variables"], rs
    assert rs["worst"] < 1e-6, rs
    assert rs["ps_splits"] == PS_TASKS, rs
    first, last = rs["losses"]
    assert last < 0.5 * first, rs
