"""Large tables under the synchronous strategies: lookups and updates read only the batch's rows.

Under mirrored and multi_worker_mirrored every replica holds a mirrored copy of
each table. `tf.gather` on a mirrored variable reads the whole table at every
lookup (a ReadVariableOp of the table's shape, then GatherV2; issue 36), and TF
reduces each table's IndexedSlices gradient with about four collectives of its
own. Checked here:

- in one process on 2 logical CPUs (mirrored): the traced step has no op of a
  table's shape (with a negative control: a plain `tf.gather` on the mirrored
  variable does read the whole table), and training with the packed sparse
  reduction gives exactly the weights one device gives for the same global batch;
- through `tfdist-launch`, the click recipe under multi_worker_mirrored (2 workers)
  and mirrored: the step report of the chief's traced step shows only sparse
  access to the tables, and the sparse gradients of all six tables cross between
  the workers in one all-gather.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import clusterlib
import pytest
from clusterlib import REPO, launch_cmd, read_records, strategy_gin

MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf, keras
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tfdist_trainer import sharding, tf_compat
    from tfdist_trainer.trainers import sparse_reduce

    TABLES = [(1000, 4, 1), (50, 3, 2), (7, 5, 1)]  # rows, width, shards

    def train(strategy, packed, lookup=None):
        keras.utils.set_random_seed(1)
        with strategy.scope():
            tables = [
                sharding.ShardedEmbedding(
                    v, d, num_shards=s, name=f"t{i}", embeddings_initializer="glorot_uniform"
                )
                for i, (v, d, s) in enumerate(TABLES)
            ]
            for t in tables:
                t.build(None)
            head = keras.layers.Dense(1)
            head.build((None, sum(d for _, d, _ in TABLES)))
            model = keras.Sequential(tables)  # only to hand step_access_report every table
            variables = [v for t in tables for v in t.trainable_variables] + head.trainable_variables
            optimizer = sharding.SparseAdagrad(0.5)
            optimizer.build(variables)
            if packed:
                tf_compat.replace_gradient_all_reduce(optimizer, sparse_reduce.all_reduce_sum)
        report = {}

        @tf.function
        def step(ids):
            def replica_step(ids):
                with tf.GradientTape() as tape:
                    if lookup is None:
                        rows = [t(ids[:, i] % t.input_dim) for i, t in enumerate(tables)]
                    else:
                        rows = [lookup(t, ids[:, i] % t.input_dim) for i, t in enumerate(tables)]
                    loss = tf.reduce_sum(tf.square(head(tf.concat(rows, -1)))) / 8.0
                gradients = tape.gradient(loss, variables)
                optimizer.apply_gradients(zip(gradients, variables))
                report.update(sharding.step_access_report(tf.compat.v1.get_default_graph(), model))
                return loss
            return strategy.run(replica_step, args=(ids,))

        ids = np.arange(24, dtype=np.int64).reshape(8, 3) * 37
        n = strategy.num_replicas_in_sync
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(ids.reshape(n, -1, 3)[ctx.replica_id_in_sync_group])
        )
        for _ in range(3):
            step(per_replica)
        weights = np.concatenate([np.asarray(v.numpy()).ravel() for v in variables])
        return weights, report

    one, _ = train(tf.distribute.OneDeviceStrategy("/cpu:0"), packed=False)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    packed, report = train(mirrored, packed=True)
    # Negative control: the lookup TensorFlow gives a mirrored variable, tf.gather on it.
    plain = lambda t, ids: tf.gather(
        tf_compat.variable_storage(t.shards[0]), ids % t.shards[0].shape[0]
    )
    _, control = train(mirrored, packed=True, lookup=plain)
    print("RESULT " + json.dumps({
        "max_difference": float(np.abs(one - packed).max()),
        "scale": float(np.abs(one).max()),
        "report": report,
        "control_full_table_ops": len(control["full_table_ops"]),
    }))
    """
)


def test_mirrored_reads_rows_only_and_packed_reduction_matches_one_device():
    proc = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT],
        cwd=REPO,
        env=clusterlib.base_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    result = clusterlib.script_result(proc.stdout)
    report = result["report"]
    assert report["full_table_ops"] == [], report
    assert report["sparse_ops"].get("ResourceGather", 0) >= 4, report
    # The same global batch on one device and on two replicas: the same weights after 3 steps.
    assert result["max_difference"] <= 1e-6 * max(1.0, result["scale"]), result
    # Negative control: tf.gather on the mirrored variable reads the first table whole.
    assert result["control_full_table_ops"] >= 1, result


@pytest.mark.cluster
def test_click_recipe_under_multi_worker_mirrored_reads_rows_and_gathers_once(tmp_path):
    model_dir = str(tmp_path / "model")
    result = clusterlib.run(
        launch_cmd(
            ["--num_workers=2"],
            [
                f"--gin_file={REPO}/configs/sharded_embedding/tiny.gin",  # step_report = True
                strategy_gin("multi_worker_mirrored"),
                "--gin_bindings=train.train_steps=40",
                "--gin_bindings=train.log_every_n_steps=20",
                f"--model_dir={model_dir}",
            ],
        ),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-8000:]
    with open(os.path.join(model_dir, "step_graph.json")) as f:
        report = json.load(f)
    assert len(report["tables"]) == 6, report
    assert report["full_table_ops"] == [], report
    # Each table is looked up and updated by row (12 gathers: a lookup and an accumulator read).
    assert report["sparse_ops"].get("ResourceGather", 0) >= 12, report
    # The six tables' sparse gradients cross in one all-gather (its shape gather and its data
    # gather), not about four collectives per table.
    assert report["collective_ops"].get("CollectiveGatherV2", 0) == 2, report
    records = read_records(model_dir)
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [20, 40], train
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and evals[-1]["eval_auc"] > 0.6, evals
