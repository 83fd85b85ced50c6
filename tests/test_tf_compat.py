"""Every private TensorFlow/Keras API the package uses (tfdist_trainer/tf_compat/), exercised for real.

When an upgrade removes or changes one, the test fails with a message naming
the API and the installed TF/Keras versions, instead of a training run failing
deep inside. Device placement (two logical CPUs) and ClusterCoordinator (a
ParameterServerStrategy on in-process servers) run in their own processes:
both change process-wide TensorFlow state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from clusterlib import REPO, base_env

from tfdist_trainer import sharding, tf_compat, variables

VERSIONS = f"TensorFlow {tf.__version__}, Keras {keras.__version__}"


def broken(api: str, what: str) -> str:
    return f"{api} no longer works as tfdist_trainer/tf_compat/ expects on {VERSIONS}: {what}"


def run_script(tmp_path, source: str, timeout: float = 180) -> dict:
    """Runs `source` in a fresh Python (the repository importable); returns the JSON of its last line."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=base_env({"GRPC_FAIL_FAST": "use_caller"}),
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines and lines[-1].startswith("{"), (
        f"the script failed on {VERSIONS} (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    )
    return json.loads(lines[-1])


#: A script's start: a ParameterServerStrategy (`strategy`, `resolver`) on in-process servers.
PS_STRATEGY = """
import json, os
import tensorflow as tf
from tfdist_trainer import tf_compat
from tfdist_trainer.launch.ports import pick_port

cluster = {job: [f"localhost:{pick_port()}"] for job in ("chief", "worker", "ps")}
spec = tf.train.ClusterSpec(cluster)
servers = [tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc", start=True)
           for job in ("worker", "ps")]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0,
                                                                rpc_layer="grpc")
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
"""

#: PS_STRATEGY's script, then its ClusterCoordinator (`coordinator`) and `hold`, a closure that
#: runs on the worker until the chief sets `release` (at most 5M spins, counted in `spins`).
PS_COORDINATOR = (
    PS_STRATEGY
    + """
import time
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    release = tf.Variable(0, dtype=tf.int32, trainable=False)
    spins = tf.Variable(0, dtype=tf.int64, trainable=False)

@tf.function
def hold():
    def body(i):
        spins.assign_add(1)
        return i + 1
    return tf.while_loop(lambda i: tf.logical_and(release.read_value() == 0, i < 5_000_000), body,
                         [tf.constant(0)])
"""
)


@pytest.fixture
def mixed_float16():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy(previous)


# -- checkpoints ------------------------------------------------------------------


def test_saveable_objects_round_trip_a_sharded_table_through_a_checkpoint(tmp_path):
    """tf.__internal__.tracking.Trackable + saveable_object.SaveableObject/SaveSpec: a table saved as
    slices of 2 shards restores into 3 shards."""
    trackable = tf_compat.trackable_base()
    assert trackable is tf.__internal__.tracking.Trackable, broken(
        "tf.__internal__.tracking.Trackable", "moved"
    )
    saveable, spec = tf_compat.saveable_classes()
    assert isinstance(tf.Variable(1.0), trackable), broken(
        "tf.__internal__.tracking.Trackable", "a tf.Variable is not one"
    )
    assert callable(getattr(saveable, "restore", None)) and spec.__init__.__code__.co_varnames[
        :6
    ] == ("self", "tensor", "slice_spec", "name", "dtype", "device"), broken(
        "tensorflow.python.training.saving.saveable_object.SaveSpec",
        "its constructor's arguments changed",
    )

    source = sharding.ShardedEmbedding(11, 3, num_shards=2, embeddings_initializer="random_normal")
    source.build()
    saved = np.concatenate([v.numpy() for v in source.shards])
    path = tf.train.Checkpoint(layer=source).save(str(tmp_path / "ckpt"))
    target = sharding.ShardedEmbedding(11, 3, num_shards=3, embeddings_initializer="zeros")
    target.build()
    tf.train.Checkpoint(layer=target).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(
        np.concatenate([v.numpy() for v in target.shards]),
        saved,
        err_msg=broken(
            "SaveableObject/SaveSpec (sliced save of a logical table)",
            "the table did not round-trip",
        ),
    )
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any(name.startswith("layer/table/") for name in names) and not any(
        "shard" in n for n in names
    ), broken("Trackable._gather_saveables_for_checkpoint", f"the checkpoint holds {names}")


def test_sliced_tensor_trackable_saves_one_tensor_as_slices_and_restores_another_slicing(tmp_path):
    """Trackable._gather_saveables_for_checkpoint + one SaveSpec per slice: two variables saved as one
    [3, 2] tensor, read back whole, restored into three one-row variables."""
    base = tf_compat.sliced_tensor_trackable()
    assert issubclass(base, tf_compat.trackable_base())

    class Table(base):
        checkpoint_key = "whole"
        checkpoint_dtype = tf.float32

        def __init__(self, parts):
            self.parts, self.rows = parts, [int(p.shape[0]) for p in parts]

        def checkpoint_slices(self):
            starts = np.cumsum([0] + self.rows)[:-1]
            return [
                (tf.Variable.SaveSliceInfo("t", [3, 2], [int(s), 0], [r, 2]).spec, p.device)
                for s, r, p in zip(starts, self.rows, self.parts)
            ]

        def read_slice(self, index):
            return self.parts[index].read_value()

        def restore_slices(self, tensors):
            return tf.group([p.assign(t) for p, t in zip(self.parts, tensors)])

    whole = np.arange(6, dtype=np.float32).reshape(3, 2)
    source = Table([tf.Variable(whole[:2]), tf.Variable(whole[2:])])
    path = tf.train.Checkpoint(table=source).save(str(tmp_path / "ckpt"))
    shapes = dict(tf.train.list_variables(path))
    assert shapes.get("table/.ATTRIBUTES/whole") == [3, 2], broken(
        "Trackable._gather_saveables_for_checkpoint", f"the checkpoint holds {shapes}"
    )
    np.testing.assert_array_equal(
        tf.train.load_checkpoint(path).get_tensor("table/.ATTRIBUTES/whole"),
        whole,
        err_msg=broken("SaveableObject/SaveSpec", "the slices do not read back as one tensor"),
    )
    target = Table([tf.Variable(tf.zeros([1, 2])) for _ in range(3)])
    tf.train.Checkpoint(table=target).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(
        np.concatenate([p.numpy() for p in target.parts]),
        whole,
        err_msg=broken("SaveableObject.restore", "three slices did not restore from two"),
    )


def test_a_checkpoint_saves_stand_ins_under_the_originals_names(tmp_path):
    """saved_tensors (current and legacy objects), saved_value (a SaveSpec read), and
    tensors_trackable + save_stand_ins: what a background save's copies rest on."""
    variable = tf.Variable([1.0, 2.0])
    whole = keras.Input((1,), dtype="int64")
    layer = sharding.ShardedEmbedding(6, 2, num_shards=2, name="t")
    keras.Model(whole, layer(whole))
    (table,) = [w.checkpoint for w in layer.sharded_weights()]
    checkpoint = tf.train.Checkpoint(v=variable, table=table)

    saved = tf_compat.saved_tensors(variable)
    assert list(saved) == ["VARIABLE_VALUE"], broken("Trackable._serialize_to_tensors", saved)
    tensor, device = tf_compat.saved_value(saved["VARIABLE_VALUE"])
    np.testing.assert_array_equal(tensor, [1.0, 2.0])
    assert device, broken("SaveSpec.device", "a variable's saved tensor has no device")
    slices = tf_compat.saved_tensors(table)
    assert len(slices) == 1 and len(next(iter(slices.values()))) == 2, broken(
        "_gather_saveables_for_checkpoint", f"a 2-shard table saves {slices}"
    )

    given = tf_compat.tensors_trackable()
    stand_ins = tf_compat.identity_dict()
    stand_ins[variable] = given({"VARIABLE_VALUE": lambda: tf.constant([7.0, 8.0])})
    key, parts = next(iter(slices.items()))
    stand_ins[table] = given({key: {spec: (lambda: tf.fill([3, 2], 5.0)) for spec in parts}})
    tf_compat.save_stand_ins(checkpoint, stand_ins)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    np.testing.assert_array_equal(
        reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE"),
        [7.0, 8.0],
        err_msg=broken("Checkpoint._saver._object_map", "the stand-in was not saved"),
    )
    assert (reader.get_tensor(f"table/.ATTRIBUTES/{key}") == 5.0).all()
    np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])  # the original is untouched


def test_replaces_checkpoint_children_chooses_what_a_checkpoint_saves(tmp_path):
    """Trackable._trackable_children(save_type): a layer's checkpoint children are what
    checkpoint_children returns; a SavedModel still sees the default ones."""

    class Renamed(tf_compat.ReplacesCheckpointChildren, keras.layers.Dense):
        def checkpoint_children(self, children):
            self.seen = sorted(children)
            return {"renamed_kernel": self.kernel}

    layer = Renamed(2)
    layer.build((None, 3))
    path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
    names = sorted(n for n, _ in tf.train.list_variables(path) if n.startswith("layer/"))
    assert names == ["layer/renamed_kernel/.ATTRIBUTES/VARIABLE_VALUE"], broken(
        "Trackable._trackable_children", f"the layer saved {names} (its children were {layer.seen})"
    )
    assert "_kernel" in layer.seen, broken(
        "Trackable._trackable_children", f"a Dense layer's children are {layer.seen}"
    )
    saved_model = tf.Module()
    saved_model.layer = layer
    layer.seen = None
    tf.saved_model.save(saved_model, str(tmp_path / "saved"))
    assert layer.seen is None, "checkpoint_children was asked for a SavedModel's children"


# -- Keras variables --------------------------------------------------------------


def test_variable_storage_is_the_stored_float32_variable_under_mixed_precision(mixed_float16):
    """KerasVariable._value: the tf.Variable; `value`/`dtype` read float16 inside a mixed-precision call."""
    dense = keras.layers.Dense(10)
    dense.build((None, 20))
    optimizer = keras.optimizers.Adam()
    optimizer.build(dense.trainable_variables)
    seen = {}

    class Probe(keras.layers.Layer):
        def call(self, x):
            for v in [dense.kernel] + optimizer.variables:
                seen[v.path] = (
                    v.value.dtype,
                    tf_compat.variable_storage(v),
                    variables.stored_bytes(v),
                )
            return x

    Probe()(tf.ones((1, 1)))
    stored = tf_compat.variable_storage(dense.kernel)
    assert isinstance(stored, tf.Variable) and stored.dtype == tf.float32, broken(
        "KerasVariable._value", f"the storage of a Dense kernel is {stored!r}"
    )
    assert stored.device == dense.kernel.value.device and np.array_equal(
        stored.numpy(), dense.kernel.numpy()
    )
    value_dtype, in_call, in_call_bytes = seen[dense.kernel.path]
    assert value_dtype == tf.float16, (
        "Keras no longer autocasts `value` in a call (variable_storage could go)"
    )
    assert in_call is stored, broken(
        "KerasVariable._value", "inside a layer call it is not the stored variable"
    )
    assert in_call_bytes == variables.stored_bytes(dense.kernel) == 20 * 10 * 4
    # Layer names are unique per process ("dense_3" after three other Dense layers): match this one's slot.
    slot = dense.kernel.path.replace("/", "_") + "_momentum"
    momentum = next(v for v in optimizer.variables if v.path.endswith(slot))
    assert seen[momentum.path][1].dtype == tf.float32 and seen[momentum.path][2] == 800
    assert tf_compat.variable_storage(stored) is stored


def test_sharded_layers_read_the_stored_tables_inside_a_mixed_precision_call(mixed_float16):
    """ShardedSoftmax multiplies by its stored float32 shards: Keras' `value` (a float16 copy inside the
    call) made the matmul fail on mixed dtypes before the shards were read through variable_storage."""
    softmax = sharding.ShardedSoftmax(7, num_shards=2)
    x = tf.random.stateless_normal([2, 4], seed=[3, 4])
    logits = softmax(x)
    assert logits.dtype == tf.float16
    kernel = np.concatenate([v.numpy() for v in softmax.kernel.variables])
    bias = np.concatenate([v.numpy() for v in softmax.bias.variables]).reshape(-1)
    np.testing.assert_allclose(logits.numpy(), x.numpy() @ kernel.T + bias, rtol=1e-2, atol=1e-2)


def test_variable_storage_device_and_recreating_it_on_another_device(tmp_path):
    """KerasVariable._value is where the variable lives; `_value = None` + `_initialize(value)` moves it
    (same Keras variable, value and flags); `_deferred_initialize` of a variable created in a
    StatelessScope runs inside the scope we give it."""
    result = run_script(
        tmp_path,
        """
        import json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
        from tfdist_trainer import tf_compat
        from tfdist_trainer import variables

        with tf.device("/CPU:1"):
            dense = keras.layers.Dense(3, name="dense")
            dense.build((None, 2))
        kernel = dense.kernel
        out = {"built_on": variables.device_of(kernel), "storage_device": tf_compat.variable_storage(kernel).device}
        before = kernel.numpy().tolist()
        with tf.device("/CPU:0"):
            tf_compat.recreate_variable_storage(kernel, tf.identity(tf_compat.variable_storage(kernel)))
        out["moved_to"] = variables.device_of(kernel)
        out["same_value"] = kernel.numpy().tolist() == before
        out["same_variable"] = dense.kernel is kernel and dense.trainable_weights[0] is kernel
        out["trainable"] = tf_compat.variable_storage(kernel).trainable
        kernel.assign_add(tf.ones_like(kernel))
        out["assign_reaches_new_storage"] = bool(tf_compat.variable_storage(kernel).numpy()[0][0] == before[0][0] + 1)

        entered = []
        import contextlib
        @contextlib.contextmanager
        def on_cpu1():
            entered.append(True)
            with tf.init_scope(), tf.device("/CPU:1"):
                yield
        with keras.StatelessScope():
            deferred = keras.Variable(initializer="ones", shape=(2,), name="deferred")
            out["deferred_storage"] = repr(tf_compat.variable_storage(deferred))
            out["wrapped"] = tf_compat.wrap_deferred_initializer(deferred, on_cpu1)
        out["deferred_entered"] = len(entered)
        out["deferred_device"] = variables.device_of(deferred)
        out["not_deferred"] = tf_compat.wrap_deferred_initializer(object(), on_cpu1)
        print(json.dumps(out))
    """,
    )
    assert (
        result["built_on"].endswith("CPU:1") and result["storage_device"] == result["built_on"]
    ), broken(
        "KerasVariable._value",
        f"a kernel built under tf.device('/CPU:1') is stored on {result['storage_device']}",
    )
    assert result["moved_to"].endswith("CPU:0"), broken(
        "KerasVariable._initialize", f"re-created storage is on {result['moved_to']}"
    )
    assert result["same_value"] and result["same_variable"] and result["trainable"], broken(
        "KerasVariable._value = None; _initialize(value)", f"the moved variable changed: {result}"
    )
    assert result["assign_reaches_new_storage"], broken(
        "KerasVariable._initialize", "assign misses the new storage"
    )
    assert result["deferred_storage"] == "None" and result["wrapped"], broken(
        "KerasVariable._deferred_initialize",
        f"a variable created in a StatelessScope is not deferred: {result}",
    )
    assert result["deferred_entered"] == 1 and result["deferred_device"].endswith("CPU:1"), broken(
        "KerasVariable._deferred_initialize",
        f"Keras did not create the deferred variable through it: {result}",
    )
    assert result["not_deferred"] is False


def test_stored_dtype_is_float32_inside_a_mixed_precision_call_and_before_storage(mixed_float16):
    """KerasVariable._dtype: the stored dtype where `dtype` reads the autocast float16, and before a
    deferred variable has storage (stored_bytes reads it then)."""
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    seen = {}

    class Probe(keras.layers.Layer):
        def call(self, x):
            seen["dtype"], seen["stored"] = dense.kernel.dtype, tf_compat.stored_dtype(dense.kernel)
            return x

    Probe()(tf.ones((1, 1)))
    assert tf.as_dtype(seen["dtype"]) == tf.float16, (
        "Keras no longer autocasts `dtype` in a call (stored_dtype could go)"
    )
    assert tf.as_dtype(seen["stored"]) == tf.float32, broken(
        "KerasVariable._dtype", f"inside a mixed-precision call it is {seen['stored']!r}"
    )
    with keras.StatelessScope():  # Keras creates the storage when the scope ends
        deferred = keras.Variable(initializer="ones", shape=(2,), dtype="float32", name="deferred")
        assert tf_compat.variable_storage(deferred) is None
        assert tf.as_dtype(tf_compat.stored_dtype(deferred)) == tf.float32, broken(
            "KerasVariable._dtype", "a deferred variable has none"
        )
        assert variables.stored_bytes(deferred) == 8
    assert tf_compat.stored_dtype(tf.Variable(1, dtype=tf.int64)) == tf.int64
    assert tf_compat.stored_dtype(object()) is None


def test_distributed_components_of_a_mirrored_variable():
    """DistributedValues._values: the per-device copies of a MirroredStrategy variable."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = tf.Variable(1.0)
        keras_variable = keras.Variable(np.zeros(3, np.float32))
    components = tf_compat.distributed_components(mirrored)
    local = tuple(strategy.experimental_local_results(mirrored))
    assert len(components) == 1 and components == local, broken(
        "DistributedValues._values", f"{components!r}, the local results are {local!r}"
    )
    assert components[0].device.endswith("CPU:0")
    stored = tf_compat.distributed_components(tf_compat.variable_storage(keras_variable))
    assert len(stored) == 1, broken(
        "DistributedValues._values", "a Keras variable made under a MirroredStrategy has no copies"
    )
    assert variables.device_of(keras_variable).endswith("CPU:0")
    assert tf_compat.distributed_components(tf.Variable(1.0)) == ()


def test_sublayers_walks_nested_layers():
    """Layer._flatten_layers(include_self, recursive): the nested layers, depth-first."""

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(2, name="inner")
            self.norm = keras.layers.LayerNormalization(name="norm")

    block = Block(name="block")
    model = keras.Sequential([keras.layers.Dense(2, name="first"), block], name="model")
    names = lambda found: [layer.name for layer in found]  # noqa: E731
    found = names(tf_compat.sublayers(model))
    assert found[:2] == ["first", "block"] and sorted(found[2:]) == ["inner", "norm"], broken(
        "Layer._flatten_layers",
        f"nested layers of a Sequential (in order, then the block's): {found}",
    )
    assert names(tf_compat.sublayers(model, recursive=False)) == ["first", "block"], broken(
        "Layer._flatten_layers(recursive=False)", "not the direct sublayers in order"
    )
    found = names(tf_compat.sublayers(block, include_self=True))
    assert found[0] == "block" and sorted(found[1:]) == ["inner", "norm"], broken(
        "Layer._flatten_layers(include_self=True)", f"gave {found}"
    )
    assert tf_compat.sublayers(object()) == []
    sharded = keras.Sequential(
        [keras.layers.Dense(2), sharding.ShardedEmbedding(5, 2, num_shards=1, name="emb")]
    )
    assert [layer.name for layer in sharding.sharded_layers(sharded)] == ["emb"]


def test_stateless_and_symbolic_scopes_are_reported_inside_them():
    """keras.src.backend.common.stateless_scope.in_stateless_scope / symbolic_scope.in_symbolic_scope."""
    assert not tf_compat.in_stateless_scope() and not tf_compat.in_symbolic_scope()
    with keras.StatelessScope():
        assert tf_compat.in_stateless_scope(), broken(
            "in_stateless_scope", "False inside keras.StatelessScope"
        )
    with keras.SymbolicScope():
        assert tf_compat.in_symbolic_scope(), broken(
            "in_symbolic_scope", "False inside keras.SymbolicScope"
        )
    seen = []

    class Probe(keras.layers.Layer):
        def call(self, x):
            seen.append(tf_compat.in_symbolic_scope() or tf_compat.in_stateless_scope())
            return x

    probe = Probe()
    inputs = keras.Input((2,))
    keras.Model(inputs, probe(inputs))  # building a functional model traces its layers symbolically
    probe(tf.ones((1, 2)))
    assert seen == [True, False], broken(
        "in_symbolic_scope/in_stateless_scope",
        f"[tracing a functional model, an eager call] gave {seen}",
    )


# -- Keras optimizers -----------------------------------------------------------------


def test_optimizer_model_variables_are_the_variables_it_was_built_for():
    """BaseOptimizer._trainable_variables: the model's variables, not the optimizer's own state."""
    kernel, bias = (
        keras.Variable(np.ones((3, 2), np.float32)),
        keras.Variable(np.zeros(2, np.float32)),
    )
    optimizer = keras.optimizers.Adam()
    assert tf_compat.optimizer_model_variables(optimizer) == []
    optimizer.build([kernel, bias])
    found = tf_compat.optimizer_model_variables(optimizer)
    assert len(found) == 2 and found[0] is kernel and found[1] is bias, broken(
        "BaseOptimizer._trainable_variables", f"an Adam built for [kernel, bias] lists {found}"
    )


def test_optimizer_scalar_children_are_iterations_and_learning_rate(tmp_path):
    """A Keras optimizer's checkpoint children `_iterations` and `_learning_rate`: saved alone, they
    restore a stock optimizer's step count and learning rate."""

    class ScalarsOnly(tf_compat.ReplacesCheckpointChildren, keras.optimizers.SGD):
        def checkpoint_children(self, children):
            return tf_compat.optimizer_scalar_children(children)

    kernel = keras.Variable(np.ones((3, 2), np.float32))
    stock = keras.optimizers.SGD(learning_rate=0.25)
    stock.build([kernel])
    stock.iterations.assign(7)
    path = tf.train.Checkpoint(optimizer=stock).save(str(tmp_path / "stock"))
    restored = ScalarsOnly(learning_rate=0.5)
    restored.build([kernel])
    tf.train.Checkpoint(optimizer=restored).restore(path).assert_existing_objects_matched()
    assert (
        int(restored.iterations.numpy()) == 7 and float(restored.learning_rate.numpy()) == 0.25
    ), broken(
        "Keras optimizer children _iterations/_learning_rate",
        f"restored iterations={restored.iterations.numpy()}, "
        f"learning_rate={restored.learning_rate.numpy()}",
    )
    path = tf.train.Checkpoint(optimizer=restored).save(str(tmp_path / "scalars"))
    names = sorted(n for n, _ in tf.train.list_variables(path) if n.startswith("optimizer/"))
    assert names == [
        "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE",
    ], broken("Keras optimizer children _iterations/_learning_rate", f"saved {names}")


def test_adagrad_accumulator_is_the_slot_of_that_variable():
    """Adagrad._accumulators[_get_variable_index(v)]: each variable's own accumulator."""
    first, second = (
        keras.Variable(np.ones((3, 2), np.float32)),
        keras.Variable(np.ones(4, np.float32)),
    )
    optimizer = keras.optimizers.Adagrad(initial_accumulator_value=0.5)
    optimizer.build([first, second])
    optimizer.apply([tf.ones((3, 2)), tf.zeros(4)], [first, second])
    for variable, expected in ((first, 1.5), (second, 0.5)):
        accumulator = tf_compat.adagrad_accumulator(optimizer, variable)
        assert tuple(accumulator.shape) == tuple(variable.shape), broken(
            "Adagrad._accumulators/_get_variable_index", f"{accumulator.path} for {variable.path}"
        )
        np.testing.assert_allclose(accumulator.numpy(), expected)


def test_optimizer_variable_is_the_keras_variable_of_what_update_step_is_handed():
    """Keras' TF backend hands update_step the stored tf.Variable; the optimizer maps it back."""
    first, second = keras.Variable(np.ones(3, np.float32)), keras.Variable(np.ones(2, np.float32))
    optimizer = keras.optimizers.SGD()
    optimizer.build([first, second])
    for variable in (first, second):
        found = tf_compat.optimizer_variable(optimizer, tf_compat.variable_storage(variable))
        assert found is variable, broken(
            "Optimizer._trainable_variables/_get_variable_index", found
        )
    stranger = tf.Variable(1.0)
    assert tf_compat.optimizer_variable(optimizer, stranger) is stranger


def test_atomic_metric_updates_lose_no_concurrent_update():
    """Keras' assign_add is assign(read + value); the patch makes a Mean metric's assign_add TF's atomic one."""
    metric = keras.metrics.Mean()
    tf_compat.make_metric_updates_atomic([metric])
    calls = []
    for v in metric.variables:
        assert "assign_add" in vars(v), broken(
            "KerasVariable._value", f"{v.path} has no tf.Variable to patch"
        )
        patched = v.assign_add
        v.assign_add = lambda value, f=patched, name=v.name: (calls.append(name), f(value))[1]
    metric.update_state([1.0])
    assert sorted(calls) == ["count", "total"], broken(
        "keras.metrics.Mean.update_state", f"no longer updates through assign_add (called: {calls})"
    )
    metric.reset_state()
    tf_compat.make_metric_updates_atomic([metric])
    threads, per_thread = 8, 150

    def add():
        for _ in range(per_thread):
            metric.update_state([1.0, 1.0])

    workers = [threading.Thread(target=add) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total, count = (float(v.numpy()) for v in metric.variables)
    assert (total, count) == (2.0 * threads * per_thread,) * 2, broken(
        "the metric assign_add patch",
        f"{threads} threads x {per_thread} updates gave total={total} count={count}",
    )


def test_confusion_matrix_metrics_accumulate_atomically():
    """Keras' AUC writes `v.assign(v + x)` itself; the patch turns each into one `assign_add(x)`:
    traced, no variable is read or written whole, and concurrent updates lose nothing."""
    labels = tf.constant([[1.0], [0.0], [1.0], [0.0]])
    scores = tf.constant([[0.9], [0.3], [0.4], [0.8]])
    metric = keras.metrics.AUC(num_thresholds=50)
    tf_compat.make_metric_updates_atomic([metric])
    graph = tf.function(lambda: metric.update_state(labels, scores)).get_concrete_function().graph
    kinds = [op.type for op in graph.get_operations()]
    assert kinds.count("AssignAddVariableOp") == 4 and "AssignVariableOp" not in kinds, broken(
        "keras.metrics.AUC.update_state (metrics_utils.update_confusion_matrix_variables)",
        f"no longer updates by `v.assign(v + x)`: {sorted(set(kinds))}",
    )
    reference = keras.metrics.AUC(num_thresholds=50)
    threads, per_thread = 8, 100
    for _ in range(threads * per_thread):
        reference.update_state(labels, scores)

    def add():
        for _ in range(per_thread):
            metric.update_state(labels, scores)

    workers = [threading.Thread(target=add) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for mine, theirs in zip(metric.variables, reference.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)
    assert float(metric.result()) == float(reference.result())


def test_an_optimizer_counts_its_steps_atomically():
    """Keras' `iterations.assign_add(1)` is `assign(read + 1)`; the patch makes it TF's assign_add."""
    weights = keras.Variable(np.ones(3, np.float32))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build([weights])
    tf_compat.make_optimizer_steps_atomic(optimizer)
    apply = tf.function(lambda: optimizer.apply([tf.ones(3)], [weights]))
    graph = apply.get_concrete_function().graph
    handle = {id(e): i for e, i in graph.captures}.get(id(optimizer.iterations.value.handle))
    writes = [op.type for op in graph.get_operations() if any(x is handle for x in op.inputs)]
    assert "AssignAddVariableOp" in writes and "AssignVariableOp" not in writes, broken(
        "keras BaseOptimizer.apply", f"no longer counts by iterations.assign_add: {writes}"
    )
    threads, per_thread = 8, 50

    def step():
        for _ in range(per_thread):
            optimizer.apply([tf.ones(3)], [weights])

    workers = [threading.Thread(target=step) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert int(optimizer.iterations.numpy()) == threads * per_thread


# -- distribution strategies and graphs ---------------------------------------------


def test_cluster_resolver_of_a_parameter_server_strategy(tmp_path):
    """ParameterServerStrategy keeps its resolver as `_cluster_resolver` (the public property is None)."""
    result = run_script(
        tmp_path,
        PS_STRATEGY
        + textwrap.dedent(
            """
        out = {
            "found": tf_compat.cluster_resolver(strategy) is resolver,
            "public": strategy.cluster_resolver is resolver,
            "default": tf_compat.cluster_resolver(tf.distribute.get_strategy()) is None,
        }
        print(json.dumps(out), flush=True)
        os._exit(0)  # in-process servers cannot be shut down cleanly
    """
        ),
    )
    assert result["found"], broken(
        "ParameterServerStrategy._cluster_resolver", f"the resolver is not found: {result}"
    )
    assert result["default"]


def test_graph_functions_hold_a_traced_loop_body():
    """Graph._functions: the body of a tf.while_loop traced in a tf.function is a function graph there."""

    @tf.function
    def loop(n):
        return tf.while_loop(lambda i: i < n, lambda i: i * 3 + 1, [tf.constant(0)])

    graph = loop.get_concrete_function(tf.TensorSpec([], tf.int32)).graph
    nested = tf_compat.graph_functions(graph)
    ops = {op.type for g in nested for op in g.get_operations()}
    assert nested and all(isinstance(g, tf.Graph) for g in nested), broken(
        "Graph._functions", f"a while loop's graph holds {nested!r}"
    )
    assert "Mul" in ops and "Mul" not in {op.type for op in graph.get_operations()}, broken(
        "Graph._functions", f"the loop body's ops are not in them: {sorted(ops)}"
    )
    assert tf_compat.graph_functions(object()) == []


# -- ClusterCoordinator -------------------------------------------------------------


def test_busy_worker_threads_on_a_real_coordinator(tmp_path):
    """The "WorkerClosureProcessingLoop-<i>" threads in Worker._process_closure, read from a
    ParameterServerStrategy + ClusterCoordinator on in-process servers."""
    result = run_script(
        tmp_path,
        PS_COORDINATOR
        + textwrap.dedent(
            """
        import threading

        def poll(condition, seconds=60):
            deadline = time.time() + seconds
            while time.time() < deadline and not condition():
                time.sleep(0.05)

        out = {}
        remote = coordinator.schedule(hold)
        poll(lambda: tf_compat.busy_worker_indices() and spins.numpy() > 0)
        out["busy_while_running"] = tf_compat.busy_worker_indices()
        release.assign(1)
        coordinator.join()
        poll(lambda: not tf_compat.busy_worker_indices(), 10)
        out["busy_after_join"] = tf_compat.busy_worker_indices()
        out["threads"] = sorted(t.name for t in threading.enumerate()
                                if t.name.startswith(tf_compat.COORDINATOR_WORKER_THREAD_PREFIX))
        print(json.dumps(out), flush=True)
        os._exit(0)  # in-process servers cannot be shut down cleanly
    """
        ),
    )
    assert result["threads"] == ["WorkerClosureProcessingLoop-0"], broken(
        "ClusterCoordinator worker threads", f"threads named {result['threads']}"
    )
    assert result["busy_while_running"] == [0], broken(
        "Worker._process_closure",
        f"no coordinator thread was inside it while a closure ran: {result}",
    )
    assert result["busy_after_join"] == [], broken(
        "Worker._process_closure", f"still busy after join: {result}"
    )


# -- compiled Keras models ------------------------------------------------------------


def _two_output_model(**compile_args):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(5)(inputs)
    model = keras.Model(
        inputs, {"cls": keras.layers.Dense(3)(hidden), "reg": keras.layers.Dense(1)(hidden)}
    )
    model.compile(optimizer="sgd", **compile_args)
    return model


def test_compiled_loss_is_found_and_built_with_one_tracker_per_output():
    """Trainer._compile_loss and CompileLoss.build: the loss given to compile(), its trackers made up front."""
    assert tf_compat.compiled_loss(keras.Sequential([keras.layers.Dense(1)])) is None
    model = _two_output_model(
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
    )
    loss = tf_compat.compiled_loss(model)
    assert loss is not None and not loss.built, broken(
        "keras Model._compile_loss",
        "compile(loss=...) no longer leaves an unbuilt CompileLoss there",
    )
    x = tf.zeros([2, 4])
    y = {"cls": tf.constant([0, 2]), "reg": tf.ones([2, 1])}
    tf_compat.build_compiled_loss(model, y, model(x))
    assert loss.built and sorted(m.name for m in loss.metrics) == ["cls_loss", "reg_loss"], broken(
        "keras CompileLoss.build", f"it made the trackers {[m.name for m in loss.metrics]}"
    )
    variables = [v for m in loss.metrics for v in m.variables]
    assert variables, broken("keras CompileLoss.build", "its trackers hold no variables")
    # The public loss now runs on the built object, loss_weights applied.
    value = float(model.compute_loss(x=x, y=y, y_pred=model(x)))
    assert np.isfinite(value)


def test_compiled_metrics_are_independent_built_copies_with_names_resolved():
    """Trainer._compile_metrics (_user_metrics, _user_weighted_metrics) and CompileMetrics(...).build."""
    assert tf_compat.compiled_metrics(keras.Sequential([keras.layers.Dense(1)]), None, None) is None
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="acc")
    model = _two_output_model(
        loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
        metrics={"cls": ["accuracy", accuracy], "reg": ["mae"]},
        weighted_metrics={"reg": ["mse"]},
    )
    x = tf.zeros([2, 4])
    y = {"cls": tf.constant([0, 2]), "reg": tf.ones([2, 1])}
    first = tf_compat.compiled_metrics(model, y, model(x))
    second = tf_compat.compiled_metrics(model, y, model(x))
    assert isinstance(first, keras.metrics.Metric) and first.built, broken(
        "keras.src.trainers.compile_utils.CompileMetrics", "not a built Metric"
    )
    assert accuracy not in first.metrics and accuracy not in second.metrics
    first.update_state(y, model(x), sample_weight=tf.ones([2]))
    results = {k: float(v) for k, v in first.result().items()}
    assert set(results) == {"cls_accuracy", "cls_acc", "reg_mae", "reg_mse"}, broken(
        "keras CompileMetrics.result", f"names {sorted(results)}"
    )
    assert all(float(v) == 0.0 for v in second.result().values()), "the copies share state"
    assert not set(map(id, first.variables)) & set(map(id, second.variables))


def test_coordination_service_accessors_in_a_process_without_one():
    """Outside a multi-process job there is no coordination service: None, and a barrier fails
    with TensorFlow's own error (the shutdown logs it and exits). With one, the orderly-shutdown
    test (tests/test_orderly_shutdown.py) exercises both on a real cluster."""
    assert tf_compat.coordination_service_config() is None
    with pytest.raises(tf.errors.FailedPreconditionError, match="not enabled"):
        tf_compat.wait_at_barrier("tfdist_trainer_test", timeout_s=1)


def test_the_packages_errors_pass_through_a_keras_layer_call_and_autograph_unchanged():
    from tfdist_trainer.errors import ConfigError

    class Refusing(keras.layers.Layer):
        def call(self, x):
            if x.dtype == tf.int64:
                raise ConfigError("ids: one sentence that names the fix.")
            return x

    layer = Refusing()

    @tf.function
    def step(x):
        return layer(x)

    with pytest.raises(ConfigError) as raised:
        step(tf.constant([1], tf.int64))
    assert str(raised.value) == "ids: one sentence that names the fix.", broken(
        "keras traceback_utils `_keras_call_info_injected` / autograph `ag_pass_through`",
        f"the error arrived as {type(raised.value).__name__}: {raised.value}",
    )
