"""Self-sharding tables (tfdist_trainer.sharding) and the sharded_embedding recipe.

In-process unit tests check the layers against dense references: lookups,
IndexedSlices gradients, the sampled softmax, SparseAdagrad, re-sharding a
checkpoint, the bytes balancer and the step-graph check (with a negative
control: a stock Keras Adagrad does touch whole tables). One subprocess places
shards on two logical CPUs (model parallel) and trains under mirrored.

The cluster tests start real processes with `tfdist-launch`: chief + 2 workers +
2 ps train the tiny recipe on synthetic clicks (hidden logistic model, oracle AUC
~0.86); the checkpoint they leave is then resumed by a cluster with 3 ps, whose
tables get 3 shards instead of 5.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import clusterlib
import keras
import numpy as np
import pytest
import tensorflow as tf
from clusterlib import REPO, launch_cmd, read_records, strategy_gin, train_cmd
from servinglib import (
    assert_each_weight_exported_once,
    checkpoint_predictions,
    model_weight_bytes,
    serve_in_clean_process,
)

from recipes.sharded_embedding import data as click_data
from tfdist_trainer import sharding, variables

TINY = [f"--gin_file={REPO}/configs/sharded_embedding/tiny.gin"]
TIMEOUT_S = 200


def logical_table(layer) -> np.ndarray:
    """The layer's table in logical row order, assembled from its shards."""
    table = layer.sharded_table if isinstance(layer, sharding.ShardedEmbedding) else layer.kernel
    full = np.zeros((table.layout.vocab, table.dim), np.float32)
    for i, v in enumerate(table.variables):
        full[table.layout.logical_rows(i)] = v.numpy()
    return full


# -- layers, in process ------------------------------------------------------------


@pytest.mark.parametrize("partition_strategy", ["div", "mod"])
@pytest.mark.parametrize("num_shards", [1, 3, 7])
def test_lookup_matches_dense_reference(partition_strategy, num_shards):
    layer = sharding.ShardedEmbedding(
        23, 4, num_shards=num_shards, partition_strategy=partition_strategy
    )
    layer.build()
    assert [v.shape[0] for v in layer.shards] == [
        layer.sharded_table.layout.rows(i) for i in range(num_shards)
    ]
    assert sum(v.shape[0] for v in layer.shards) == 23
    ids = tf.constant([[0, 22, 5], [5, 5, 11], [21, 1, 0]], tf.int64)  # repeats, both ends
    np.testing.assert_array_equal(layer(ids).numpy(), logical_table(layer)[ids.numpy()])
    np.testing.assert_array_equal(layer(tf.range(23)).numpy(), logical_table(layer))


@pytest.mark.parametrize("partition_strategy", ["div", "mod"])
def test_gradient_is_indexed_slices_and_equals_dense_gradient(partition_strategy):
    layer = sharding.ShardedEmbedding(10, 3, num_shards=3, partition_strategy=partition_strategy)
    layer.build()
    ids = tf.constant([1, 9, 4, 1, 7])
    weights = tf.random.stateless_normal([5, 3], seed=[1, 2])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids) * weights)
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads), [type(g) for g in grads]

    dense = tf.Variable(logical_table(layer))
    with tf.GradientTape() as tape:
        reference = tf.convert_to_tensor(
            tape.gradient(tf.reduce_sum(tf.gather(dense, ids) * weights), dense)
        )
    got = np.zeros((10, 3), np.float32)
    for i, g in enumerate(grads):
        got[layer.sharded_table.layout.logical_rows(i)] = tf.convert_to_tensor(g).numpy()
    np.testing.assert_allclose(got, reference.numpy(), rtol=1e-6)


def test_more_shards_than_rows_is_one_clear_error():
    with pytest.raises(ValueError, match=r"num_shards=5 is larger than the table's 3 rows") as info:
        sharding.ShardedEmbedding(3, 2, num_shards=5, name="tiny_table")
    assert "tiny_table" in str(info.value) and "at most 3 shards" in str(info.value)


def test_out_of_range_id_names_the_table():
    layer = sharding.ShardedEmbedding(10, 2, num_shards=2, name="ids_table")
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"ids_table/embeddings: ids must be < 10"
    ):
        layer(tf.constant([3, 10]))


def _click_model(num_shards: int, partition_strategy: str, optimizer_cls):
    ids = keras.Input((2,), dtype="int64")
    rows = sharding.ShardedEmbedding(
        37, 3, num_shards=num_shards, partition_strategy=partition_strategy, name="table"
    )(ids)
    out = keras.layers.Dense(1, name="out")(keras.layers.Flatten()(rows))
    model = keras.Model(ids, out)
    optimizer = optimizer_cls(learning_rate=0.3)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _train_step(model, optimizer, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(ids) - 1.0) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return float(loss)


@pytest.mark.parametrize("optimizer_cls", [sharding.SparseAdagrad, sharding.SGD])
@pytest.mark.parametrize(
    "before, after", [((2, "div"), (3, "div")), ((2, "mod"), (3, "div")), ((3, "div"), (2, "mod"))]
)
def test_checkpoint_reshards_exactly(tmp_path, monkeypatch, optimizer_cls, before, after):
    """2 -> 3 shards (and div <-> mod): the restored table, optimizer slots and next step are identical."""
    # "mod" tables save in several slices
    monkeypatch.setattr(sharding.fixed.checkpoint, "CHECKPOINT_SLICE_BYTES", 5 * 3 * 4)
    ids = tf.constant([[1, 2], [36, 1], [7, 20], [2, 2]], tf.int64)
    model, optimizer = _click_model(*before, optimizer_cls)
    for _ in range(3):
        _train_step(model, optimizer, ids)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    keys = [k for k, _ in tf.train.list_variables(path)]
    assert not any("_shard_" in k or "_trainable_variables" in k for k in keys), keys
    table_key = next(k for k in keys if k.startswith("model/") and k.endswith("/table"))
    np.testing.assert_array_equal(
        tf.train.load_checkpoint(path).get_tensor(table_key), logical_table(model.layers[1])
    )

    expected_table = logical_table(model.layers[1])
    expected_loss = _train_step(model, optimizer, ids)
    restored, restored_optimizer = _click_model(*after, optimizer_cls)
    tf.train.Checkpoint(model=restored, optimizer=restored_optimizer).restore(
        path
    ).assert_existing_objects_matched()
    assert len(restored.layers[1].shards) == after[0]
    np.testing.assert_array_equal(logical_table(restored.layers[1]), expected_table)
    assert _train_step(restored, restored_optimizer, ids) == expected_loss
    np.testing.assert_array_equal(logical_table(restored.layers[1]), logical_table(model.layers[1]))


def test_sparse_adagrad_matches_keras_adagrad():
    table = sharding.ShardedEmbedding(12, 2, num_shards=1)
    table.build()
    ids = tf.constant([3, 3, 11, 0])
    dense = tf.Variable(table.shards[0].numpy())
    sparse_opt = sharding.SparseAdagrad(0.5)
    keras_opt = keras.optimizers.Adagrad(0.5)
    for _ in range(3):
        with tf.GradientTape(persistent=True) as tape:
            a = tf.reduce_sum(table(ids) ** 2)
            b = tf.reduce_sum(tf.gather(dense, ids) ** 2)
        sparse_opt.apply_gradients([(tape.gradient(a, table.shards[0]), table.shards[0])])
        keras_opt.apply_gradients([(tf.convert_to_tensor(tape.gradient(b, dense)), dense)])
    np.testing.assert_allclose(table.shards[0].numpy(), dense.numpy(), rtol=1e-5)


@pytest.mark.parametrize("partition_strategy", ["div", "mod"])
def test_sharded_softmax_matches_dense_reference(partition_strategy):
    softmax = sharding.ShardedSoftmax(
        50,
        num_shards=4,
        partition_strategy=partition_strategy,
        kernel_initializer=keras.initializers.RandomNormal(seed=1),
    )
    x = tf.random.stateless_normal([6, 5], seed=[3, 4])
    logits = softmax(x)
    kernel = logical_table(softmax)
    bias = tf.random.stateless_normal([50], seed=[5, 6])
    for i, v in enumerate(softmax.bias.variables):  # non-zero bias, shard by shard
        v.assign(tf.gather(bias, softmax.bias.layout.logical_rows(i))[:, None])
    np.testing.assert_allclose(
        softmax(x).numpy(), x.numpy() @ kernel.T + bias.numpy(), rtol=1e-5, atol=1e-5
    )
    assert logits.shape == (6, 50)

    labels = tf.constant([0, 49, 7, 7, 30, 2], tf.int64)
    sampled = tf.random.log_uniform_candidate_sampler(labels[:, None], 1, 10, True, 50, seed=9)
    with tf.GradientTape() as tape:
        loss = softmax.sampled_loss(x, labels, sampled_values=sampled)
    grads = tape.gradient(loss, softmax.trainable_variables)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    reference = tf.nn.sampled_softmax_loss(
        weights=tf.constant(kernel),
        biases=bias,
        labels=labels[:, None],
        inputs=x,
        num_sampled=10,
        num_classes=50,
        sampled_values=sampled,
    )
    np.testing.assert_allclose(loss.numpy(), reference.numpy(), rtol=1e-5)


def test_step_report_sees_only_sparse_access_and_flags_a_dense_optimizer():
    def report(optimizer):
        model, _ = _click_model(3, "div", sharding.SGD)
        optimizer.build(model.trainable_variables)
        found = {}

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(ids) ** 2)
            optimizer.apply_gradients(
                zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            )
            found.update(sharding.step_access_report(tf.compat.v1.get_default_graph(), model))

        step(tf.constant([[1, 2]], tf.int64))
        return found

    sparse = report(sharding.SparseAdagrad(0.1))
    assert sparse["full_table_ops"] == [] and sparse["sparse_ops"].get("ResourceGather", 0) >= 3, (
        sparse
    )
    # Negative control: Keras' Adagrad computes sqrt(accumulator + eps) over the whole table.
    dense = report(keras.optimizers.Adagrad(0.1))
    assert dense["full_table_ops"], dense


def test_ledger_balances_bytes_and_placement_table_reports_them():
    ledger = sharding.PlacementLedger()
    devices = ["/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]
    already = tf.Variable(tf.zeros([100]))  # 400 bytes already on ps 0
    ledger.record(already, devices[0])
    plan = ledger.plan([300, 300, 100, 100], devices)
    load = {
        d: (400 if d == devices[0] else 0)
        + sum(s for s, p in zip([300, 300, 100, 100], plan) if p == d)
        for d in devices
    }
    assert load[devices[0]] == load[devices[1]] == 600, plan

    layer = sharding.ShardedEmbedding(10, 4, num_shards=2, name="placed")
    layer.build()
    text = sharding.placement_table(layer)
    assert (
        "placed/embeddings_shard_0" in text
        and "5x4" in text
        and "80" in text
        and "bytes per task" in text
    )
    records = sharding.placement_records(layer)
    assert [r["bytes"] for r in records["variables"]] == [80, 80]


def test_record_all_variables_counts_each_shard_once():
    """A shard is created inside the recorder *and* recorded by its layer: one variable, one count."""
    with (
        tf.distribute.OneDeviceStrategy("/cpu:0").scope(),
        sharding.record_all_variables() as ledger,
    ):
        layer = sharding.ShardedEmbedding(10, 4, num_shards=2, name="counted_once")
        layer.build()
        dense = keras.Variable(np.zeros([6, 4], np.float32), name="beside_the_table")
    tasks = {variables.device_of(v) for v in [*layer.shards, dense]}
    assert len(tasks) == 1, tasks
    # 10 x 4 float32 rows in two shards, plus the 6 x 4 variable beside them.
    assert ledger.bytes_on(tasks.pop()) == (10 + 6) * 4 * 4


# -- data ---------------------------------------------------------------------------


def test_synthetic_clicks_are_deterministic_and_learnable():
    generator = click_data.SyntheticClicks([500, 50], num_dense=4, seed=3)
    first = list(generator.dataset(128, num_batches=8))
    again = list(generator.dataset(128, num_batches=8))
    np.testing.assert_array_equal(first[3][0]["categorical"], again[3][0]["categorical"])
    ids = np.concatenate([f["categorical"].numpy() for f, _ in first])
    assert ids.min() >= 0 and ids[:, 0].max() < 500 and ids[:, 1].max() < 50
    auc = keras.metrics.AUC(from_logits=True)
    for features, labels in first:
        auc.update_state(labels, generator.oracle_logits(features))
    assert 0.65 < float(auc.result()) < 0.95  # two features only: the oracle is ~0.73
    two_workers = [
        list(generator.dataset(128, num_batches=8, pipeline_id=p, num_pipelines=2)) for p in (0, 1)
    ]
    np.testing.assert_array_equal(two_workers[1][0][0]["categorical"], first[1][0]["categorical"])


def test_criteo_reader_parses_and_hashes(tmp_path):
    rows = [
        "1\t5\t\t3\t-1" + "\t0" * 9 + "\t68fd1e64\t\t" + "\t".join(["aa"] * 24),
        "0" + "\t1" * 13 + "\t" + "\t".join(["05db9164"] * 26),
    ]
    path = tmp_path / "day_0.tsv"
    path.write_text("\n".join(rows) + "\n")
    vocab = [1000] * 26
    ((features, labels),) = list(click_data.criteo_dataset(str(path), 2, vocab, training=False))
    np.testing.assert_array_equal(labels.numpy(), [[1.0], [0.0]])
    np.testing.assert_allclose(
        features["dense"][0, :4], [np.log1p(5), 0.0, np.log1p(3), 0.0], rtol=1e-6
    )
    assert features["categorical"].shape == (2, 26)
    assert int(features["categorical"][0, 0]) == int(
        tf.strings.to_hash_bucket_fast("68fd1e64", 1000)
    )
    assert int(features["categorical"][1, 0]) == int(features["categorical"][1, 25])


def test_click_trainer_on_criteo_files_in_process(tmp_path):
    """The recipe's Trainer end to end in this process: Criteo TSV in, placement report out, a step taken."""
    from recipes.sharded_embedding.trainer import ClickTrainer
    from tfdist_trainer.runtime import state as state_lib
    from tfdist_trainer.trainers import data as data_lib

    lines = [
        f"{i % 2}"
        + "".join(f"\t{(i * 7 + j) % 50}" for j in range(13))
        + "".join(f"\t{(i * 31 + j * 17) % 9973:08x}" for j in range(26))
        for i in range(40)
    ]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
    trainer = ClickTrainer(
        vocab_sizes=[300] * 26,
        embedding_dim=4,
        num_shards=3,
        partition_strategy="mod",
        hidden_units=(8,),
        optimizer="sgd",
        learning_rate=0.1,
        data_source="criteo",
        criteo_train_files=str(tmp_path / "*.tsv"),
        criteo_eval_files=str(tmp_path / "train.tsv"),
        report_dir=str(tmp_path / "reports"),
        global_batch_size=8,
    )
    state_lib.build_state(trainer, tf.distribute.get_strategy())
    assert len(sharding.sharded_layers(trainer.model)) == 26
    assert all(len(layer.shards) == 3 for layer in sharding.sharded_layers(trainer.model))
    placement = json.loads((tmp_path / "reports" / "placement.json").read_text())
    assert sum(1 for r in placement["variables"] if "_shard_" in r["name"]) == 26 * 3
    features, labels = next(iter(trainer.build_train_dataset(data_lib.single_pipeline_context())))
    assert features["categorical"].shape == (8, 26) and labels.shape == (8, 1)
    loss = tf.function(trainer.train_step)((features, labels))
    assert np.isfinite(float(loss))
    # 40 lines / 8
    assert sum(1 for _ in trainer.build_eval_dataset(data_lib.single_pipeline_context())) == 5


# -- devices: model parallel and mirrored (one subprocess: logical CPUs need a fresh TF) --

DEVICES_SCRIPT = textwrap.dedent("""
    import json, keras, numpy as np, tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    from tfdist_trainer import sharding
    out = {}
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    # Model parallel: shards spread over the given devices, bytes-balanced (3 shards of 40/30/30 rows).
    table = sharding.ShardedEmbedding(100, 4, num_shards=3, devices=cpus, name="mp")
    table.build()
    out["model_parallel"] = [v.value.device for v in table.shards]
    out["mp_lookup_ok"] = bool(np.allclose(table(tf.constant([0, 99, 50])).numpy()[1],
                                           table.shards[2].numpy()[-1]))
    # Mirrored: every replica holds every shard; sparse gradients are summed over replicas.
    strategy = tf.distribute.MirroredStrategy(cpus)
    with strategy.scope():
        emb = sharding.ShardedEmbedding(40, 2, num_shards=2, name="mirrored")
        emb.build()
        dense = keras.layers.Dense(1, name="head")  # dense and sparse gradients in one all-reduce
        dense.build((None, 2))
        weights = emb.trainable_variables + dense.trainable_variables
        opt = sharding.SparseAdagrad(0.5)
        opt.build(weights)
    before = [v.numpy().copy() for v in emb.shards]
    # Per replica and per step, the ids (and so each shard's distinct-id count) change, and the steps
    # run inside a tf.while_loop like the Trainer's loop: TF's all-gather of IndexedSlices between
    # replicas fails there when sizes change ("Shape mismatch in the collective instance").
    # Steps 0 and 1: both replicas have 1, then 2 distinct ids per shard (equal sizes that change);
    # later steps: the replicas differ.
    patterns = tf.constant([[1, 1, 30, 30], [1, 2, 30, 31]], tf.int64)
    @tf.function
    def steps():
        def replica(i):
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            ids = tf.gather(patterns, tf.where(i < 2, i, (i + tf.cast(r, tf.int32)) % 2))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((dense(emb(ids)) - 1.0) ** 2)
            grads = tape.gradient(loss, weights)
            opt.apply_gradients(zip(grads, weights))
            return loss
        def body(i):
            strategy.run(replica, args=(i,))
            return i + 1
        tf.while_loop(lambda i: i < 6, body, [tf.constant(0)])  # explicit: no AutoGraph in `python -c`
    for _ in range(3):  # several calls, as the Trainer makes
        steps()
    out["mirrored_replicas"] = strategy.num_replicas_in_sync
    out["mirrored_devices"] = sorted({v.device for v in emb.shards[0].value.values})
    changed = [np.flatnonzero(np.abs(b - v.numpy()).sum(1)).tolist() for b, v in zip(before, emb.shards)]
    out["mirrored_changed_rows"] = changed
    print("RESULT " + json.dumps(out))
""")


def test_model_parallel_devices_and_mirrored_training():
    env = clusterlib.base_env()
    proc = subprocess.run(
        [sys.executable, "-c", DEVICES_SCRIPT],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    result = json.loads(
        next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[
            len("RESULT ") :
        ]
    )
    placed = result["model_parallel"]
    assert (
        placed[0].endswith("CPU:0") and placed[1].endswith("CPU:1") and placed[2].endswith("CPU:1")
    ), placed
    assert result["mp_lookup_ok"]
    assert result["mirrored_replicas"] == 2 and len(result["mirrored_devices"]) == 2
    # ids 1, 2 in shard 0; 30, 31 = rows 10, 11 of shard 1
    assert result["mirrored_changed_rows"] == [
        [1, 2],
        [10, 11],
    ]


# -- real clusters -------------------------------------------------------------------


def _launch(model_dir: str, num_ps: int, *bindings: str) -> subprocess.CompletedProcess:
    args = [
        *TINY,
        strategy_gin("parameter_server"),
        f"--model_dir={model_dir}",
        *[f"--gin_bindings={b}" for b in bindings],
    ]
    result = clusterlib.run(
        launch_cmd(["--num_workers=2", f"--num_ps={num_ps}"], args), timeout=TIMEOUT_S
    )
    assert result.returncode == 0, (
        f"tfdist-launch exited {result.returncode}:\n{result.stdout[-8000:]}"
    )
    assert clusterlib.no_process_left(model_dir) == []
    return result


def _read_json(model_dir: str, name: str) -> dict:
    with open(os.path.join(model_dir, name)) as f:
        return json.load(f)


def _shard_tasks(placement: dict) -> dict[str, set[str]]:
    tasks: dict[str, set[str]] = {}
    for record in placement["variables"]:
        if "_shard_" in record["name"]:
            table = record["name"].split("/")[-2]  # ".../table_0/embeddings_shard_1"
            tasks.setdefault(table, set()).add(record["device"].split("/device:")[0])
    return tasks


FIRST_STEPS, MORE_STEPS = 300, 40


@pytest.fixture(scope="module")
def two_ps_run(tmp_path_factory):
    """chief + 2 workers + 2 ps, 5 shards per table (not a multiple of 2: the balancer has work to do)."""
    model_dir = str(tmp_path_factory.mktemp("sharded") / "model")
    result = _launch(
        model_dir,
        2,
        f"train.train_steps={FIRST_STEPS}",
        "train.log_every_n_steps=50",
        "ClickTrainer.num_shards=5",
    )
    # Kept now: the 3-ps run of the next test rewrites these files.
    reports = {name: _read_json(model_dir, name) for name in ("placement.json", "step_graph.json")}
    yield model_dir, result, reports
    for entry in clusterlib.no_process_left(model_dir):
        os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)


@pytest.mark.cluster
def test_parameter_server_two_ps_balanced_sparse_and_learns(two_ps_run):
    model_dir, result, reports = two_ps_run
    # Saved in the background by default (train.async_checkpoint): the ps copy their own parts.
    assert re.search(
        r"saved checkpoint \S+/ckpt-\d+ in [\d.]+s in the background \(training waited",
        result.stdout,
    ), result.stdout[-5000:]
    placement = reports["placement.json"]
    ps_bytes = {t: b for t, b in placement["bytes_per_task"].items() if "/job:ps/" in t}
    assert sorted(ps_bytes) == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"], placement[
        "bytes_per_task"
    ]
    assert max(ps_bytes.values()) <= 1.10 * min(ps_bytes.values()), (
        f"ps bytes not balanced within 10%: {ps_bytes}"
    )
    tasks = _shard_tasks(placement)
    # the largest table is split over both ps
    assert len(tasks) == 6 and len(tasks["table_0"]) == 2, tasks
    shards = [r for r in placement["variables"] if "_shard_" in r["name"]]
    assert len(shards) == 6 * 5
    # One placement line on the console; a few MiB of variables are not worth an imbalance there.
    placement_lines = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("[chief:0]") and "variable placement:" in line
    ]
    assert len(placement_lines) == 1 and "imbalance" not in placement_lines[0], placement_lines

    step = reports["step_graph.json"]
    assert step["full_table_ops"] == [], (
        f"the step touches whole tables: {step['full_table_ops'][:5]}"
    )
    # one per shard at least; under parameter_server SparseAdagrad updates each shard's rows and
    # accumulator rows by TF's fused kernel, holding both variables' locks (exact updates)
    assert step["sparse_ops"].get("ResourceGather", 0) >= 30, step["sparse_ops"]
    assert step["sparse_ops"].get("ResourceSparseApplyAdagradV2", 0) >= 30, step["sparse_ops"]

    records = read_records(model_dir)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert train[-1]["step"] == FIRST_STEPS and evals[-1]["step"] == FIRST_STEPS
    assert train[-1]["loss"] < train[0]["loss"]
    # Chance is 0.5; the true logits reach ~0.86 on this data.
    assert evals[-1]["eval_auc"] > 0.7, evals[-1]


@pytest.mark.cluster
def test_a_model_sharded_over_two_ps_exports_and_serves_from_a_clean_process(two_ps_run):
    """--mode=export of the 2-ps run: a clean process (stock TF only) gives its predictions."""
    model_dir, _, _ = two_ps_run
    bindings = ["ClickTrainer.num_shards=5"]
    export = clusterlib.run(
        train_cmd(
            *TINY,
            strategy_gin("parameter_server"),
            f"--model_dir={model_dir}",
            *[f"--gin_bindings={b}" for b in bindings],
            "--mode=export",
        ),
        timeout=TIMEOUT_S,
    )
    assert export.returncode == 0, export.stdout[-4000:]
    inputs, expected = checkpoint_predictions(
        [TINY[0].split("=", 1)[1]],
        bindings,
        os.path.join(model_dir, f"ckpt-{FIRST_STEPS}"),
        examples=1000,
        unseen=0,
    )
    export_dir = os.path.join(model_dir, "export", f"ckpt-{FIRST_STEPS}")
    served, _ = serve_in_clean_process(export_dir, inputs)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    assert_each_weight_exported_once(
        export_dir, model_weight_bytes(os.path.join(model_dir, f"ckpt-{FIRST_STEPS}"))
    )


RAW_IDS = {"int64": "ClickTrainer.id_space='open'", "string": "ClickTrainer.key_dtype='string'"}


@pytest.mark.cluster
@pytest.mark.parametrize("key_dtype", sorted(RAW_IDS))
def test_fixed_tables_of_raw_ids_export_a_model_that_serves_keys_it_never_saw(tmp_path, key_dtype):
    """Raw ids (64-bit or strings) hashed into fixed tables (`BucketHash`), trained under
    one_device and exported at the end: a clean process serves them, a third of them keys no
    training batch held, as the checkpoint's model does."""
    model_dir = str(tmp_path / "model")
    steps = 20
    bindings = [RAW_IDS[key_dtype], "ClickTrainer.num_shards=3"]
    run_only = [
        f"train.train_steps={steps}",
        "ClickTrainer.eval_batches=1",
        "ClickTrainer.step_report=False",
        "train.extra_hooks=[@ExportSavedModel()]",
    ]
    trained = clusterlib.run(
        train_cmd(
            *TINY,
            strategy_gin("one_device"),
            f"--model_dir={model_dir}",
            *[f"--gin_bindings={b}" for b in [*bindings, *run_only]],
        ),
        timeout=TIMEOUT_S,
    )
    assert trained.returncode == 0, trained.stdout[-4000:]
    checkpoint = os.path.join(model_dir, f"ckpt-{steps}")
    inputs, expected = checkpoint_predictions(
        [TINY[0].split("=", 1)[1]], bindings, checkpoint, examples=600, unseen=200
    )
    assert inputs["categorical"].dtype.kind == ("S" if key_dtype == "string" else "i")
    export_dir = os.path.join(model_dir, "export", str(steps))
    served, ops = serve_in_clean_process(export_dir, inputs)
    assert served.shape == expected.shape == (600, 1)
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    assert "Fingerprint" in ops, ops  # the keys are hashed in the served model
    assert_each_weight_exported_once(export_dir, model_weight_bytes(checkpoint))


def _trained_rows_since(saved_prefix: str, resumed_prefix: str) -> dict[str, int]:
    """Checks, table by table, that `resumed_prefix` (a later checkpoint of a run resumed from
    `saved_prefix`) holds the saved rows and Adagrad accumulators, trained on: no accumulator
    row shrank, and every table row whose accumulator row is unchanged (a row no step since has
    trained, or barely) is the saved row. Returns the count of those rows per table."""
    saved, resumed = (
        tf.train.load_checkpoint(saved_prefix),
        tf.train.load_checkpoint(resumed_prefix),
    )
    keys = saved.get_variable_to_shape_map()
    tables = {m.group(1): k for k in keys if (m := re.match(r"model/.*/(table_\d+)/table/", k))}
    slots = {
        m.group(1): k
        for k in keys
        if (m := re.match(r"optimizer/sharded\.S(table_\d+)\.Sembeddings\.Saccumulator/", k))
    }
    assert len(tables) == 6 and sorted(slots) == sorted(tables), keys
    untrained = {}
    for name, key in tables.items():
        slot_saved, slot_resumed = saved.get_tensor(slots[name]), resumed.get_tensor(slots[name])
        assert (slot_resumed >= slot_saved).all(), f"{name}: accumulator rows shrank"
        same = (slot_resumed == slot_saved).all(axis=1)
        # Not exactly: a gradient small enough leaves its accumulator row as it was (float32
        # rounds g**2 away) and still moves the row, by at most lr * 2**-12 a step; another row
        # or a row not restored is ~1e-2 away (rows start within +-0.01).
        np.testing.assert_allclose(
            resumed.get_tensor(key)[same],
            saved.get_tensor(key)[same],
            rtol=0,
            atol=1e-3,
            err_msg=name,
        )
        untrained[name] = int(same.sum())
    return untrained


@pytest.mark.cluster
def test_two_ps_checkpoint_resumes_on_three_ps_with_its_rows_and_slots_at_the_same_loss(
    two_ps_run,
):
    model_dir, _, _ = two_ps_run
    before = read_records(model_dir)
    last_train = [r for r in before if r["kind"] == "train"][-1]
    last_eval = [r for r in before if r["kind"] == "eval"][-1]
    first_train = [r for r in before if r["kind"] == "train"][0]

    result = _launch(
        model_dir, 3, f"train.train_steps={FIRST_STEPS + MORE_STEPS}", "train.log_every_n_steps=20"
    )
    assert f"(step {FIRST_STEPS})" in result.stdout and "restored" in result.stdout
    # The tables (6, and SparseAdagrad's 6 slot tables) apart from the rest of the checkpoint,
    # a slice at a time, each ps reading its own rows.
    assert re.search(
        r"restored 12 sharded table\(s\), [\d.]+ MiB, a slice at a time", result.stdout
    ), result.stdout[-5000:]
    placement = _read_json(model_dir, "placement.json")
    ps_tasks = {t for t in placement["bytes_per_task"] if "/job:ps/" in t}
    assert len(ps_tasks) == 3, placement["bytes_per_task"]
    # 5 -> 3 shards a table
    assert len([r for r in placement["variables"] if "_shard_" in r["name"]]) == 6 * 3
    # The 3 ps restored the rows and accumulators the 2 ps saved: rows the 40 steps since did not
    # train read as saved. table_0's ids are Zipf-like over 4,000 rows: ~3,000 distinct ones in
    # 40 steps of 256 examples, so ~1,000 of its rows compare.
    untrained = _trained_rows_since(
        os.path.join(model_dir, f"ckpt-{FIRST_STEPS}"),
        os.path.join(model_dir, f"ckpt-{FIRST_STEPS + MORE_STEPS}"),
    )
    assert untrained["table_0"] >= 400, untrained

    after = read_records(model_dir)[len(before) :]
    resumed = [r for r in after if r["kind"] == "train"]
    assert resumed[0]["step"] == FIRST_STEPS + 20, resumed
    # Training goes on from where it was, not from scratch.
    assert abs(resumed[0]["loss"] - last_train["loss"]) < 0.03, (resumed[0], last_train)
    assert first_train["loss"] - resumed[0]["loss"] > 2 * abs(
        resumed[0]["loss"] - last_train["loss"]
    )
    final_eval = [r for r in after if r["kind"] == "eval"][-1]
    assert final_eval["eval_loss"] < last_eval["eval_loss"] + 0.01, (final_eval, last_eval)
    assert final_eval["eval_auc"] > last_eval["eval_auc"] - 0.01, (final_eval, last_eval)


def test_equal_sized_shards_of_one_initializer_start_different_and_seeded_ones_reproduce():
    # One unseeded Keras initializer instance fixes its seed when constructed: every shard
    # called with it got the same rows before each shard got its own draw.
    unseeded = sharding.ShardedEmbedding(
        10, 3, num_shards=2, embeddings_initializer=keras.initializers.RandomUniform(-1, 1)
    )
    unseeded.build(None)
    first, second = (v.numpy() for v in unseeded.shards)
    assert not np.allclose(first, second)

    def seeded():
        layer = sharding.ShardedEmbedding(
            10, 3, num_shards=2, embeddings_initializer=keras.initializers.RandomUniform(seed=3)
        )
        layer.build(None)
        return [v.numpy() for v in layer.shards]

    again, once_more = seeded(), seeded()
    assert not np.allclose(again[0], again[1])
    np.testing.assert_array_equal(again[0], once_more[0])
    np.testing.assert_array_equal(again[1], once_more[1])
