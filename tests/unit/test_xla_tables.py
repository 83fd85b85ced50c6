"""Sharded tables under XLA (`jit_compile`), in process: the same rows, gradients and training
steps as without it, for 1, 2 and 3 shards and both partition strategies, and one sentence for
what XLA cannot compile.

Outside XLA a table of several shards reads each shard's distinct ids (`tf.unique`,
`tf.dynamic_partition`, `tf.dynamic_stitch`), which XLA cannot compile ("Reading input as
constant from a dynamic tensor is not yet supported"); inside an XLA compile every shard reads
every distinct id, masked, with shapes fixed by the ids' (`ShardedWeight.gather`). One model holds
every kind of fixed table, 'div' and 'mod' side by side: a `ShardedEmbedding`, an
`EmbeddingGroup` (one table without `unique`), a keras-rs model bridged by `from_keras_rs` (a
table shared by two features, one of them combined) and a `ShardedSoftmax` (its logits and its
sampled loss). Training steps run the Trainer's own loop with `jit_compile=True` against its
train_step run eagerly. Mirrored runs the lookups in a replica (one CPU replica); its compiled
training step needs GPUs (TF's MirroredStrategy all-reduces on CPUs by a `merge_call`, which an XLA
function cannot make: any model, refused over several CPUs by `check_jit_compile`). Under
parameter_server TF cannot compile a worker's step against variables on the ps tasks: refused
(here, and end to end in tests/test_jit_compile_refusals.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("keras_rs")

BATCH = 8
DIM = 4
VOCABS = {"alone": 23, "g0": 17, "g1": 11, "shared": 13}
SHAPES = {"alone": (2,), "g0": (3,), "g1": (), "a": (), "b": (3,)}
TABLE_OF = {"a": "shared", "b": "shared"}
CLASSES = 9


def _init(seed: int):
    import keras

    return keras.initializers.RandomNormal(stddev=0.5, seed=seed)


def _bridge(num_shards: int, partition: str):
    """`from_keras_rs` of two features sharing one table: 'a' looked up, 'b' averaged."""
    import keras_rs

    from tfdist_trainer import sharding

    shared = keras_rs.layers.TableConfig(
        name="shared",
        vocabulary_size=VOCABS["shared"],
        embedding_dim=DIM,
        combiner="mean",
        initializer=_init(3),
    )
    configs = {
        name: keras_rs.layers.FeatureConfig(name, shared, (BATCH, *SHAPES[name]), (BATCH, DIM))
        for name in "ab"
    }
    return sharding.from_keras_rs(configs, num_shards=num_shards, partition_strategy=partition)


def _tables(num_shards: int):
    """Every kind of fixed table, 'div' and 'mod', in one functional model: ids in, their
    embeddings concatenated out ([BATCH, 8 * DIM])."""
    import keras

    from tfdist_trainer import sharding

    def table(name, partition, seed, **kwargs):
        return sharding.ShardedEmbedding(
            VOCABS[name],
            DIM,
            num_shards=num_shards,
            partition_strategy=partition,
            embeddings_initializer=_init(seed),
            name=f"table_{name}",
            **kwargs,
        )

    inputs = {k: keras.Input(s, dtype="int64", name=k) for k, s in SHAPES.items()}
    alone = table("alone", "div", 0)(inputs["alone"])
    group = sharding.EmbeddingGroup(
        [table("g0", "mod", 1), table("g1", "div", 2, unique=False)], name="group"
    )
    g0, g1 = group([inputs["g0"], inputs["g1"]])
    bridged = _bridge(num_shards, "mod")({k: inputs[k] for k in "ab"})
    flat = [keras.layers.Flatten()(alone), keras.layers.Flatten()(g0), g1]
    return keras.Model(inputs, keras.layers.Concatenate()(flat + [bridged[k] for k in "ab"]))


def _batch(seed: int = 0):
    """One batch of ids with repeats (what `unique` reads once) and its labels."""
    rng = np.random.default_rng(seed)
    features = {
        k: rng.integers(0, VOCABS[TABLE_OF.get(k, k)], size=(BATCH, *s)).astype("int64")
        for k, s in SHAPES.items()
    }
    features["alone"][:, 1] = features["alone"][:, 0]  # a repeated id in every row
    return features, rng.integers(0, CLASSES, size=BATCH).astype("int64")


def _assert_close(got, want, what: str) -> None:
    import tensorflow as tf

    got, want = tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


# -- the lookup and its gradient ----------------------------------------------------------


def test_in_xla_compile_is_true_only_while_xla_compiles():
    import tensorflow as tf

    from tfdist_trainer import tf_compat

    seen = {}

    def ask(where):
        seen[where] = tf_compat.in_xla_compile()
        return tf.constant(0)

    ask("eager")
    tf.function(lambda: ask("graph"))()
    tf.function(lambda: ask("xla"), jit_compile=True)()
    tf.function(lambda: tf.function(lambda: ask("nested"))(), jit_compile=True)()
    assert seen == {"eager": False, "graph": False, "xla": True, "nested": True}


def _strategy(name: str):
    import tensorflow as tf

    return {
        "default": tf.distribute.get_strategy,
        "one_device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
        "mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
    }[name]()


@pytest.mark.parametrize(
    "strategy_name, num_shards", [("default", 1), ("mirrored", 2), ("one_device", 3)]
)
def test_jit_compiled_rows_and_gradients_equal_eager(strategy_name, num_shards):
    """Every table kind's rows and every shard's gradient, XLA against eager (which reads each
    shard's distinct ids), in a replica of the strategy."""
    import tensorflow as tf

    strategy = _strategy(strategy_name)
    with strategy.scope():
        tables = _tables(num_shards)
    assert len(tables.trainable_variables) == 4 * num_shards
    features = {k: tf.constant(v) for k, v in _batch()[0].items()}

    def rows_and_gradients(features):
        with tf.GradientTape() as tape:
            rows = tables(features)
            loss = tf.reduce_sum(tf.square(rows) * tf.range(8 * DIM, dtype=rows.dtype))
        gradients = tape.gradient(loss, tables.trainable_variables)
        return rows, [tf.convert_to_tensor(g) for g in gradients]

    def in_replica(fn):
        outputs = strategy.run(fn, args=(features,))
        return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t)[0], outputs)

    rows, gradients = in_replica(tf.function(rows_and_gradients, jit_compile=True))
    want_rows, want_gradients = in_replica(rows_and_gradients)
    _assert_close(rows, want_rows, "rows")
    for variable, got, want in zip(tables.trainable_variables, gradients, want_gradients):
        _assert_close(got, want, variable.path)


def _softmax():
    from tfdist_trainer import sharding

    softmax = sharding.ShardedSoftmax(
        CLASSES, num_shards=3, partition_strategy="mod", kernel_initializer=_init(5)
    )
    softmax.build((None, DIM))
    return softmax


def test_a_sharded_softmax_compiles_logits_and_sampled_loss_equal_to_eager():
    """Its logits, its sampled loss (an accidental hit removed) and their gradients."""
    import tensorflow as tf

    softmax = _softmax()
    x = tf.random.stateless_normal([BATCH, DIM], seed=[1, 2])
    labels = tf.constant(_batch()[1])
    sampled = tf.constant([int(labels[0]), 2, 5], tf.int64)  # example 0's class: a hit
    sampled_values = (sampled, tf.fill([BATCH, 1], 0.3), tf.fill([3], 0.2))

    def outputs_and_gradients(x):
        with tf.GradientTape() as tape:
            logits = softmax(x)
            sampled_loss = softmax.sampled_loss(x, labels, sampled_values=sampled_values)
            loss = tf.reduce_mean(sampled_loss) + tf.reduce_mean(tf.square(logits))
        gradients = tape.gradient(loss, softmax.trainable_variables)
        return [logits, sampled_loss], [tf.convert_to_tensor(g) for g in gradients]

    got, got_gradients = tf.function(outputs_and_gradients, jit_compile=True)(x)
    want, want_gradients = outputs_and_gradients(x)
    assert float(want[1][0]) < float(want[1][1]) + 50  # finite: the hit is removed, not -inf
    for what, g, w in zip(["logits", "sampled loss"], got, want):
        _assert_close(g, w, what)
    for variable, g, w in zip(softmax.trainable_variables, got_gradients, want_gradients):
        _assert_close(g, w, variable.path)


def test_the_jit_gradient_of_a_sharded_table_stays_indexed_slices():
    """What sharding.SGD and SparseAdagrad update row by row: one row per id and shard."""
    import tensorflow as tf

    from tfdist_trainer import sharding

    table = sharding.ShardedEmbedding(10, 3, num_shards=3, embeddings_initializer=_init(0))
    ids = tf.constant([[1, 7], [7, 9]])
    table(ids)

    @tf.function(jit_compile=True)
    def gradient_shapes(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(ids))
        gradients = tape.gradient(loss, table.trainable_variables)
        assert all(isinstance(g, tf.IndexedSlices) for g in gradients), gradients
        return [tf.shape(g.values)[0] for g in gradients]

    assert [int(n) for n in gradient_shapes(ids)] == [4, 4, 4]


# -- training steps ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_shards, optimizer", [(1, "SparseAdagrad"), (2, "Adagrad")])
def test_an_optimizer_step_under_xla_updates_the_rows_eager_does(num_shards, optimizer):
    """Ids repeated in the batch. SparseAdagrad, given a gradient of dynamic size (`tf.unique`
    under XLA, what one shard compiled to before), skipped rows; Keras' Adagrad squares each row
    of a sparse gradient, so an id's rows must come once."""
    import keras
    import tensorflow as tf

    from tfdist_trainer import sharding

    ids = tf.constant([[1, 7], [7, 9], [0, 0]])
    optimizers = {"SparseAdagrad": sharding.SparseAdagrad, "Adagrad": keras.optimizers.Adagrad}

    def updated(jit_compile: bool) -> list:
        table = sharding.ShardedEmbedding(
            10, 3, num_shards=num_shards, embeddings_initializer=_init(1)
        )
        table(ids)
        step_optimizer = optimizers[optimizer](0.5)
        step_optimizer.build(table.trainable_variables)

        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(table(ids)))
            gradients = tape.gradient(loss, table.trainable_variables)
            step_optimizer.apply_gradients(zip(gradients, table.trainable_variables))

        (tf.function(step, jit_compile=True) if jit_compile else step)(ids)
        return [v.numpy() for v in table.trainable_variables]

    for got, want in zip(updated(jit_compile=True), updated(jit_compile=False)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _trainer(num_shards: int):
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer

    class XlaTablesTrainer(Trainer):
        def build_model(self):
            tables = _tables(num_shards)
            return keras.Model(tables.inputs, keras.layers.Dense(CLASSES)(tables.outputs[0]))

        def build_optimizer(self):
            # Keras' Adam squares each row of a sparse gradient: an id's rows must come once.
            return keras.optimizers.Adam(0.5)

        def build_train_dataset(self, input_context):
            return tf.data.Dataset.from_tensors(_batch(seed=1)).repeat()

        def compute_loss(self, labels, logits):
            return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return XlaTablesTrainer(global_batch_size=BATCH)


def _trained(strategy, num_shards: int, jit_compile: bool):
    """The loss and the model's weights after two steps: the Trainer's own loop with XLA, or its
    train_step run eagerly."""
    import keras
    import tensorflow as tf

    from tfdist_trainer.runtime import loops
    from tfdist_trainer.runtime import state as state_lib

    keras.utils.set_random_seed(0)
    trainer = _trainer(num_shards)
    global_step, _ = state_lib.build_state(trainer, strategy)
    if jit_compile:
        loss = loops.TrainLoop(strategy, trainer, global_step, 2, jit_compile=True).train(2).loss
    else:
        batch = tf.nest.map_structure(tf.constant, _batch(seed=1))
        with strategy.scope():
            losses = [float(strategy.run(trainer.train_step, args=(batch,))) for _ in range(2)]
        loss = sum(losses) / 2
    return loss, {v.path.split("/", 1)[-1]: v.numpy() for v in trainer.model.weights}


def test_the_trainers_jit_compiled_loop_trains_as_its_eager_steps():
    """Two steps of the Trainer's loop under one_device with `train.jit_compile` against its
    train_step run eagerly, 3 shards a table, Keras' Adam (whose compiled arithmetic differs
    in the last digits): the same loss and weights."""
    strategy = _strategy("one_device")
    loss, weights = _trained(strategy, 3, jit_compile=True)
    want_loss, want = _trained(strategy, 3, jit_compile=False)
    assert np.isfinite(loss) and loss == pytest.approx(want_loss, rel=1e-5)
    assert weights.keys() == want.keys()
    for path, value in want.items():
        np.testing.assert_allclose(weights[path], value, rtol=1e-4, atol=1e-5, err_msg=path)


# -- what XLA cannot compile: one sentence --------------------------------------------------

DYNAMIC_REFUSAL = (
    "dyn: a DynamicEmbedding cannot run in an XLA-compiled step (train.jit_compile=True, or a "
    "jit_compile function): XLA has no kernels for its key -> row hash tables; set "
    "train.jit_compile=False, or use a ShardedEmbedding of fixed size."
)


def test_a_model_with_a_dynamic_table_is_refused_before_its_step_is_traced():
    import keras
    import tensorflow as tf

    from tfdist_trainer import sharding
    from tfdist_trainer.errors import ConfigError
    from tfdist_trainer.sharding.dynamic.embedding import refuse_jit_compile

    keys = keras.Input((2,), dtype="int64")
    rows = sharding.DynamicEmbedding(3, 64, num_shards=2, name="dyn")(keys)
    model = keras.Model(keys, keras.layers.Flatten()(rows))
    with pytest.raises(ConfigError) as raised:
        refuse_jit_compile(model)
    assert str(raised.value) == DYNAMIC_REFUSAL
    refuse_jit_compile(_tables(2))  # fixed tables compile

    # Called in a user's own jit_compile function, the same sentence (TF wraps it while tracing).
    with pytest.raises(Exception, match="a DynamicEmbedding cannot run in an XLA-compiled step"):
        tf.function(lambda k: model(k, training=True), jit_compile=True)(
            tf.constant([[1, 2]], tf.int64)
        )


def test_a_sampled_loss_that_draws_its_classes_is_refused_under_xla():
    import tensorflow as tf

    softmax = _softmax()
    with pytest.raises(Exception, match="which XLA cannot compile"):
        tf.function(lambda x: softmax.sampled_loss(x, tf.constant([1, 2])), jit_compile=True)(
            tf.zeros([2, DIM])
        )


PS_REFUSAL = (
    "train.jit_compile=True cannot run parameter_server: a worker's step reads and updates "
    "variables on the ps tasks, and TensorFlow's XLA compiles a step only against variables on "
    "its own device ('Trying to access resource ... located in device /job:ps/...'); set "
    "train.jit_compile=False, or use one_device, or mirrored / multi_worker_mirrored on GPUs."
)


def test_parameter_server_refuses_jit_compile_in_one_sentence():
    """TF cannot compile a worker's step against variables on the ps tasks ('Trying to access
    resource ... located in device /job:ps/...'): refused when the runtime starts."""
    from tfdist_trainer.errors import ConfigError
    from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
    from tfdist_trainer.runtime.strategies.parameter_server import ParameterServerRuntime

    runtime = ParameterServerRuntime(ParameterServer(), strategy=None, coordinator=object())
    runtime.check_jit_compile(False)
    with pytest.raises(ConfigError) as raised:
        runtime.check_jit_compile(True)
    assert str(raised.value) == PS_REFUSAL
