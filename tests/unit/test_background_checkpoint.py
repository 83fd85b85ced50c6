"""Tables at their size, in process. The background writer (`train.async_checkpoint`): a save
holds the state of its step while training goes on, and writes the same checkpoint a
synchronous save writes. A restart: tables start as zeros and are restored a slice at a time.

The model carries every kind of object a checkpoint saves differently: Keras variables and an
Adagrad optimizer's slots, a `ShardedEmbedding` (saved as slices of one logical table), a
`DynamicEmbedding` (saved as its keys and rows, whose shapes change as keys arrive) and
`SparseAdagrad`'s reshardable slots. Multi-task runs (the ps's own parts) are in
tests/test_background_checkpoints.py.
"""

from __future__ import annotations

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.eager.context import context as eager_context

from tfdist_trainer import sharding, tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.runtime import checkpoints
from tfdist_trainer.runtime.checkpoints import Checkpointer
from tfdist_trainer.runtime.checkpoints.background_writer import BackgroundWriter
from tfdist_trainer.sharding.fixed import checkpoint as sharding_checkpoint
from tfdist_trainer.sharding.fixed import restore as table_restore

BATCHES = [
    (
        np.array([[i % 7, (3 * i) % 11], [i % 5, 100 + i]], np.int64),
        np.array([[i % 40, (7 * i) % 50], [i % 13, 49 - i % 50]], np.int64),
    )
    for i in range(12)
]


def trained_state(steps: int):
    """(checkpoint, global_step, step function) of a model with both kinds of table, trained."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((2,), dtype="int64")
    fixed = keras.Input((2,), dtype="int64")
    grown = sharding.DynamicEmbedding(4, 16, num_shards=2, min_count=1, name="grown")(ids)
    table = sharding.ShardedEmbedding(50, 4, num_shards=2, name="table")(fixed)
    joined = keras.layers.Concatenate()(
        [keras.layers.Flatten()(grown), keras.layers.Flatten()(table)]
    )
    model = keras.Model([ids, fixed], keras.layers.Dense(1, name="out")(joined))
    optimizer = sharding.SparseAdagrad(0.1)
    optimizer.build(model.trainable_variables)
    global_step = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(list(batch), training=True) - 1.0))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        global_step.assign_add(1)

    for batch in BATCHES[:steps]:
        step(batch)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, global_step=global_step)
    return checkpoint, global_step, step


def checkpointer(
    model_dir: str, checkpoint, global_step, *, background: bool, keep: int = 5, **kwargs
) -> Checkpointer:
    return Checkpointer(
        model_dir=model_dir,
        cluster=ClusterConfig(cluster={}),
        checkpoint=checkpoint,
        global_step=global_step,
        keep=keep,
        background=background,
        **kwargs,
    )


def contents(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(prefix)
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def object_graph(prefix) -> list:
    """Per node of a checkpoint's object graph: its children, and each attribute's name, key and
    whether it records a variable's own name."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(
        tf.train.load_checkpoint(str(prefix)).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    )
    return [
        (
            [(c.node_id, c.local_name) for c in node.children],
            [(a.name, a.checkpoint_key, bool(a.full_name)) for a in node.attributes],
        )
        for node in graph.nodes
    ]


def is_table(key: str) -> bool:
    """Whether checkpoint key `key` is a table's (a sharded table's or its optimizer slot's
    slices, a dynamic table's keys and rows): what a background write reads when it writes it."""
    return key.endswith("/.ATTRIBUTES/table") or "/dynamic_table/.ATTRIBUTES/" in key


def saved_synchronously(model_dir, state) -> dict[str, np.ndarray]:
    """The contents of a synchronous save of `state` (a `trained_state`) at its step."""
    checkpoint, global_step, _ = state
    step = int(global_step.numpy())
    checkpointer(str(model_dir), checkpoint, global_step, background=False).save(step)
    return contents(str(model_dir / f"ckpt-{step}"))


@pytest.fixture
def writes_held(monkeypatch) -> threading.Event:
    """A background write starts only once the returned event is set: training goes on first."""
    go = threading.Event()
    write = BackgroundWriter._write_in_background

    def held(self, *args):
        go.wait(60)
        write(self, *args)

    monkeypatch.setattr(BackgroundWriter, "_write_in_background", held)
    return go


def test_a_background_checkpoint_holds_its_step_and_the_tables_as_its_write_read_them(
    tmp_path, writes_held
):
    """What `Checkpointer.save` promises of a background save while training goes on: the step
    counter and everything but the tables as they were at the step (here 6); each table part
    as it was when the write read it (here after step 12: the write starts once training has
    gone on). A restore gives back exactly that state."""
    checkpoint, global_step, step = trained_state(steps=6)
    writer = checkpointer(str(tmp_path / "bg"), checkpoint, global_step, background=True)
    writer.save(6)
    for batch in BATCHES[6:]:
        step(batch)
    writes_held.set()
    writer.wait()
    saved = contents(str(tmp_path / "bg" / "ckpt-6"))

    at_the_step = saved_synchronously(tmp_path / "sync-6", trained_state(steps=6))
    after = saved_synchronously(tmp_path / "sync-12", trained_state(steps=12))
    expected = {key: (after if is_table(key) else at_the_step)[key] for key in at_the_step}
    assert saved.keys() == expected.keys()
    # Every kind of object is there: slices of the sharded table and of its optimizer slot, the
    # dynamic table's keys, dense weights.
    names = sorted(expected)
    assert sum(name.endswith("/.ATTRIBUTES/table") for name in names) == 2, names
    assert any(name.endswith("/dynamic_table/.ATTRIBUTES/keys") for name in names), names
    changed = [k for k in expected if not np.array_equal(at_the_step[k], after[k])]
    assert any(map(is_table, changed)) and not all(map(is_table, changed)), changed
    for name, value in expected.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    assert int(saved["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 6
    # The object graph too, each variable's own name recorded (what warm start matches by;
    # the reference model, built later in this process, has Keras' "_1" names).
    assert object_graph(tmp_path / "bg" / "ckpt-6") == object_graph(tmp_path / "sync-6" / "ckpt-6")
    names = tf_compat.checkpoint_variable_names(str(tmp_path / "bg" / "ckpt-6"), child="model")
    assert "out/kernel" in names.values(), names

    restored = trained_state(steps=0)
    assert checkpointer(str(tmp_path / "bg"), *restored[:2], background=False).restore() == 6
    again = saved_synchronously(tmp_path / "again", restored)
    for name, value in expected.items():
        if name != "save_counter/.ATTRIBUTES/VARIABLE_VALUE":  # counts this save too
            np.testing.assert_array_equal(again[name], value, err_msg=name)


def test_a_background_checkpoint_restores_and_trains_on_as_the_synchronous_one(tmp_path):
    checkpoint, global_step, _ = trained_state(steps=8)
    writer = checkpointer(str(tmp_path / "bg"), checkpoint, global_step, background=True)
    writer.save(8)
    writer.wait()

    restored, restored_step, restored_train = trained_state(steps=0)
    assert (
        checkpointer(str(tmp_path / "bg"), restored, restored_step, background=True).restore() == 8
    )
    reference, ref_step, ref_train = trained_state(steps=8)
    for batch in BATCHES[8:]:
        restored_train(batch)
        ref_train(batch)
    for a, b in zip(restored.model.weights, reference.model.weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, err_msg=a.path)


def test_a_second_save_waits_for_the_first_and_each_is_listed_whole(tmp_path):
    checkpoint, global_step, step = trained_state(steps=2)
    writer = checkpointer(str(tmp_path), checkpoint, global_step, background=True)
    for i in range(3):
        writer.save(int(global_step.numpy()))
        step(BATCHES[i])
    writer.wait()
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in state.all_model_checkpoint_paths] == [
        "ckpt-2",
        "ckpt-3",
        "ckpt-4",
    ]
    for prefix in state.all_model_checkpoint_paths:
        assert int(contents(prefix)["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == int(
            prefix.rsplit("-", 1)[-1]
        )


# -- a background save with tables big enough to matter: what training waits, what it holds --

#: A 4-shard table of 64 MiB shards ("div": a saved slice is a shard).
SHARDS, SHARD_ROWS, DIM = 4, 262_144, 64
SHARD_BYTES = SHARD_ROWS * DIM * 4


def big_table() -> tuple[tf.train.Checkpoint, tf.Variable, list]:
    """(checkpoint, global step, the table's shard variables) of a model with one 256 MiB table."""
    ids = keras.Input((1,), dtype="int64")
    layer = sharding.ShardedEmbedding(
        SHARDS * SHARD_ROWS,
        DIM,
        num_shards=SHARDS,
        embeddings_initializer=keras.initializers.Constant(0.5),
        name="big",
    )
    model = keras.Model(ids, layer(ids))
    global_step = tf.Variable(0, dtype=tf.int64)
    (table,) = layer.sharded_weights()
    return (
        tf.train.Checkpoint(model=model, global_step=global_step),
        global_step,
        table.tf_variables(),
    )


def keeping_one(model_dir, checkpoint, global_step, *, background: bool) -> Checkpointer:
    """A checkpointer that keeps one checkpoint (these are 256 MiB each), restored (fresh):
    the background writer's copies are made and its write traced, as at a task's start."""
    writer = checkpointer(str(model_dir), checkpoint, global_step, background=background, keep=1)
    writer.restore()
    return writer


def seconds(call) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_training_waits_for_a_background_save_a_small_part_of_a_synchronous_one(tmp_path):
    """`save()` returns once the small state is copied; the table (256 MiB) is read and
    written by the thread. Issue 50's bound: <= 10% of a synchronous save of the same state
    (measured here: well under 1%). The least of three saves each, after a first one (a traced
    function's first call is slower)."""
    checkpoint, global_step, _ = big_table()
    sync = keeping_one(tmp_path / "sync", checkpoint, global_step, background=False)
    synchronous = min(seconds(lambda s=s: sync.save(s)) for s in (1, 2, 3))
    writer = keeping_one(tmp_path / "bg", checkpoint, global_step, background=True)
    waited = []
    for s in (4, 5, 6, 7):
        waited.append(seconds(lambda s=s: writer.save(s)))
        writer.wait()
    assert min(waited[1:]) <= 0.1 * synchronous, (waited, synchronous)
    assert tf.train.load_checkpoint(str(tmp_path / "bg" / "ckpt-7")).get_tensor(
        "model/_operations/1/table/.ATTRIBUTES/table"
    ).shape == (SHARDS * SHARD_ROWS, DIM)


def test_a_background_save_holds_one_table_shard_besides_the_tables(tmp_path):
    """The extra memory of background saves while training updates every shard: the write
    copies a shard, writes it and lets it go before the next, so the peak is the tables plus
    one shard (and the small state's copies), not the tables twice. Counted by TF's own CPU
    allocator (oneDNN's, on by default on x86 Linux), which the copies and the writes go
    through; its peak is reset before the writer is made."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except ValueError:
        pytest.skip("this TensorFlow keeps no statistics of its CPU allocator")
    checkpoint, global_step, shards = big_table()
    stop = threading.Event()

    def train():  # every shard updated all along, as training does
        rows = np.random.default_rng(0)
        while not stop.is_set():
            for shard in shards:
                ids = tf.constant(rows.integers(0, SHARD_ROWS, 256))
                shard.scatter_add(tf.IndexedSlices(tf.ones([256, DIM]), ids))

    training = threading.Thread(target=train)
    training.start()
    try:
        time.sleep(0.2)
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        writer = keeping_one(tmp_path, checkpoint, global_step, background=True)
        for s in (1, 2):
            global_step.assign(s)
            writer.save(s)
            writer.wait()
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    finally:
        stop.set()
        training.join()
    extra = peak - before
    assert extra <= 1.5 * SHARD_BYTES, f"{extra / SHARD_BYTES:.2f} shards besides the tables"


def traced_checkpointer(tmp_path, checkpoint, global_step, background: bool) -> Checkpointer:
    """parameter_server's checkpointer (its traced write), restored (fresh) under the strategy
    scope the training loop saves in."""
    writer = checkpointer(
        str(tmp_path),
        checkpoint,
        global_step,
        background=background,
        spans_tasks=True,  # parameter_server's traced write
    )
    writer.restore()
    return writer


def save_on_a_thread_of_its_own(writer: Checkpointer, step: int) -> set[str]:
    """Saves `step` from a new thread (outside the strategy scope, as the stall save does) and
    waits until it is durable; returns the names of the functions defined once it is."""

    def save():
        writer.save(step)
        writer.wait()

    saver = threading.Thread(target=save)
    saver.start()
    saver.join()
    return set(eager_context().list_function_names())


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_a_save_from_another_thread_defines_no_new_function(tmp_path, background):
    """The parameter_server chief's stall save runs on a thread of its own, outside the strategy
    scope the first saves ran in. A new function would be registered on every task, and with a
    silent worker that hangs the chief for good (seen in CI: no watchdog line for 140s)."""
    checkpoint, global_step, step = trained_state(steps=2)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():  # where the training loop saves
        writer = traced_checkpointer(tmp_path, checkpoint, global_step, background)
        writer.save(2)
        writer.wait()
        known = set(eager_context().list_function_names())
    step(BATCHES[2])
    assert save_on_a_thread_of_its_own(writer, 3) == known
    assert int(contents(str(tmp_path / "ckpt-3"))["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 3


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
def test_the_first_save_defines_no_function_the_start_did_not(tmp_path, background):
    """The write is traced when the state is restored, on the training thread, while every task
    answers: the first save (in the background, or the stall save's thread) defines nothing. A
    function defined then is registered on every task, and a worker whose link went down
    meanwhile held the chief for good (seen under load: the step-40 background save never ended)."""
    checkpoint, global_step, _ = trained_state(steps=2)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        writer = traced_checkpointer(tmp_path, checkpoint, global_step, background)
        known = set(eager_context().list_function_names())
    assert save_on_a_thread_of_its_own(writer, 2) == known
    assert int(contents(str(tmp_path / "ckpt-2"))["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 2


# -- a restart reads its tables in chunks, never initialising them first ----------------------


def table_model(num_shards: int, partition_strategy: str, seed: int) -> tuple[keras.Model, list]:
    ids = keras.Input((1,), dtype="int64")
    layer = sharding.ShardedEmbedding(
        50,
        3,
        num_shards=num_shards,
        partition_strategy=partition_strategy,
        embeddings_initializer=keras.initializers.RandomUniform(seed=seed),
        name="table",
    )
    return keras.Model(ids, layer(ids)), layer.shards


def model_checkpointer(model_dir: str, model: keras.Model, *, step: int = 0) -> Checkpointer:
    """A synchronous checkpointer of `model` and a global step at `step`."""
    global_step = tf.Variable(step, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, global_step=global_step)
    return checkpointer(model_dir, checkpoint, global_step, background=False)


def logical_rows(model: keras.Model) -> np.ndarray:
    return model(np.arange(50)[:, None]).numpy()[:, 0]


@pytest.mark.parametrize(
    "saved, restored",
    [((2, "div"), (3, "div")), ((2, "div"), (3, "mod")), ((3, "mod"), (2, "div"))],
)
def test_a_restore_reads_each_table_a_slice_at_a_time_into_any_layout(
    tmp_path, monkeypatch, saved, restored
):
    # "mod" saves and restores slices of 7 rows (8 slices); "div" a shard at a time.
    monkeypatch.setattr(sharding_checkpoint, "CHECKPOINT_SLICE_BYTES", 7 * 3 * 4)
    model, _ = table_model(*saved, seed=1)
    model_checkpointer(str(tmp_path), model, step=30).save(30)

    assert checkpoints.resumes(str(tmp_path))
    with table_restore.restore_follows():
        fresh, shards = table_model(*restored, seed=2)
    assert all(not shard.numpy().any() for shard in shards)  # zeros: no random draw first
    assert model_checkpointer(str(tmp_path), fresh).restore() == 30
    np.testing.assert_array_equal(logical_rows(fresh), logical_rows(model))


def test_a_table_saved_with_another_vocabulary_is_a_model_mismatch(tmp_path):
    model, _ = table_model(2, "div", seed=1)
    model_checkpointer(str(tmp_path), model, step=5).save(5)
    ids = keras.Input((1,), dtype="int64")
    other = keras.Model(ids, sharding.ShardedEmbedding(60, 3, num_shards=2, name="table")(ids))
    with pytest.raises(ConfigError) as raised:
        model_checkpointer(str(tmp_path), other).restore()
    message = str(raised.value)
    compact = message.replace(" ", "")
    assert "\n" not in message and "[50,3]" in compact and "[60,3]" in compact, message
