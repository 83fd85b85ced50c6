"""The one module allowed to touch private TensorFlow and Keras APIs (checked on TF 2.21 / Keras 3.15).

Each use is one small function whose docstring says what it relies on and why
there is no public way. tests/test_tf_compat.py exercises every one of them
against the installed TensorFlow and Keras, so an upgrade that removes or
changes one fails there, by name, instead of deep inside a training run.

TensorFlow and Keras are imported inside the functions: importing this module
starts nothing (model-parallel plans are checked before TF starts).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

#: Name prefix of ClusterCoordinator's per-worker threads ("WorkerClosureProcessingLoop-<worker index>").
COORDINATOR_WORKER_THREAD_PREFIX = "WorkerClosureProcessingLoop-"
#: The `Worker` method a coordinator thread is inside while it runs a closure on its worker.
COORDINATOR_BUSY_FRAME = "_process_closure"


# -- checkpoints ------------------------------------------------------------------


def trackable_base() -> type:
    """`tf.__internal__.tracking.Trackable`: the base of every object a `tf.train.Checkpoint` can hold.

    A sharded table is saved as one logical tensor, so its checkpoint child is
    not a variable but an object that supplies its own saveables
    (`_gather_saveables_for_checkpoint`). Only a Trackable may do that; TF has
    no public base class for it (`tf.Module` is one, but brings variable
    tracking that would save the shards a second time).
    """
    import tensorflow as tf

    return tf.__internal__.tracking.Trackable


def saveable_classes() -> tuple[type, type]:
    """(SaveableObject, SaveSpec) from `tensorflow.python.training.saving.saveable_object`.

    The checkpoint API that TF's own `ShardedVariable` uses to save slices of
    one tensor from several variables (each slice a SaveSpec with its
    `SaveSliceInfo` spec), so that a restore may ask for any other slicing.
    TF exports no public way to save one tensor as slices held by several
    variables (`tf.train.experimental.PythonState` saves one string).
    """
    from tensorflow.python.training.saving import saveable_object

    return saveable_object.SaveableObject, saveable_object.SaveSpec


# -- Keras variables --------------------------------------------------------------


def variable_storage(variable: Any) -> Any:
    """The TF variable that stores a Keras variable (`KerasVariable._value`); None before it is created.

    A TF variable (or any non-Keras value) is returned as it is. Keras' public
    `variable.value` is not the storage: inside a mixed-precision layer call it
    is a float16 *copy* (autocast), and before a deferred variable is created it
    is a placeholder. The device a variable lives on, the bytes it stores and
    atomic TF updates (`assign_add`, `scatter_add`) need the stored variable
    itself; Keras 3 has no public accessor for it.
    """
    import keras

    if isinstance(variable, keras.Variable):
        return variable._value  # noqa: SLF001
    return variable


def recreate_variable_storage(variable: Any, value: Any) -> None:
    """Creates a built Keras variable's storage anew from `value` (`_value = None`, then `_initialize`).

    The new tf.Variable is created under the caller's device and variable
    creator scopes, with the Keras variable's dtype, name, trainability and
    aggregation (the TF backend's `Variable._initialize`). This moves a
    variable to another device; Keras has no public way (`assign` keeps the
    device, and a new Keras variable would not be the one the layer, its
    optimizer slots and checkpoints already reference).
    """
    variable._value = None  # noqa: SLF001  (_initialize refuses nothing, but must not see the old storage)
    variable._initialize(value)  # noqa: SLF001


def wrap_deferred_initializer(variable: Any, scope: Callable[[], AbstractContextManager]) -> bool:
    """Makes Keras run a deferred variable's creation inside `scope()`; False when it is not deferred.

    A Keras variable created inside a `StatelessScope` (Keras builds some
    layers that way) gets no storage: Keras creates it later by calling the
    variable's `_deferred_initialize()`, outside the layer's build, so outside
    any device scope the layer had. Replacing that method on the instance is
    the only hook Keras offers to choose where the storage is created.
    """
    original = getattr(variable, "_deferred_initialize", None)
    if original is None:
        return False

    def initialize():
        with scope():
            original()

    variable._deferred_initialize = initialize  # noqa: SLF001
    return True


def sublayers(layer: Any, *, include_self: bool = False, recursive: bool = True) -> list:
    """The layers nested in a Keras layer (`Layer._flatten_layers`), depth-first; [] for a non-layer.

    Keras 3 lists the direct sublayers of a Model (`model.layers`) but has no
    public way to walk the sublayers of any layer, or to walk them all.
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return []
    return list(flatten(include_self=include_self, recursive=recursive))


def in_stateless_scope() -> bool:
    """Whether Keras is inside a `keras.StatelessScope` (a call that must not touch variables).

    `keras.StatelessScope` is public, asking whether one is active is not
    (`keras.src.backend.common.stateless_scope.in_stateless_scope`).
    """
    from keras.src.backend.common.stateless_scope import in_stateless_scope as active

    return bool(active())


def in_symbolic_scope() -> bool:
    """Whether Keras is inside a `keras.SymbolicScope` (shape inference on `keras.Input`s).

    `keras.SymbolicScope` is public, asking whether one is active is not
    (`keras.src.backend.common.symbolic_scope.in_symbolic_scope`).
    """
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope as active

    return bool(active())


def make_metric_updates_atomic(metrics: Sequence[Any]) -> None:
    """Makes the `assign_add` of the metrics' variables one atomic TF `assign_add` on their storage.

    Keras 3 implements `Variable.assign_add` as `assign(self + value)`: two
    parameter_server workers updating the same ps variable at once lose one
    update, and accuracy can exceed 1 (total and count lose different amounts).
    TF's own `assign_add` on the stored tf.Variable is atomic on the ps. Keras
    has no public switch for it, so each metric variable's `assign_add` is
    replaced on the instance (read by `Mean`, `Sum`, accuracy metrics, ...).
    """
    import tensorflow as tf

    for metric in metrics:
        for variable in metric.variables:
            backing = variable_storage(variable)
            if isinstance(backing, tf.Variable) and backing is not variable:
                variable.assign_add = lambda value, b=backing: b.assign_add(tf.cast(value, b.dtype))


# -- ClusterCoordinator -------------------------------------------------------------


def remote_value_finished(remote_value: Any) -> bool:
    """Whether a ClusterCoordinator RemoteValue holds its result or error, without blocking.

    Reads `RemoteValueImpl._status` (a `RemoteValueStatus`): the public
    `fetch()` and `get()` block until the closure has run, and a closure on a
    worker whose link is down never runs.
    """
    status = getattr(remote_value, "_status", None)
    return status is not None and status.name != "NOT_READY"


def busy_worker_indices() -> list[int]:
    """Indices of the workers whose ClusterCoordinator thread is running a closure right now.

    ClusterCoordinator keeps one thread per worker, named
    "WorkerClosureProcessingLoop-<index>", that sits in `Worker._process_closure`
    while its worker runs a closure. TF has no public view of which worker holds
    which closure, so this reads the thread names and their Python stacks.
    """
    frames = sys._current_frames()  # noqa: SLF001
    busy = []
    for thread in threading.enumerate():
        if not thread.name.startswith(COORDINATOR_WORKER_THREAD_PREFIX):
            continue
        frame = frames.get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == COORDINATOR_BUSY_FRAME:
                busy.append(int(thread.name[len(COORDINATOR_WORKER_THREAD_PREFIX) :]))
                break
            frame = frame.f_back
    return sorted(busy)


# -- compiled Keras models ------------------------------------------------------------


def compiled_loss(model: Any) -> Any:
    """The `CompileLoss` that `model.compile(loss=...)` made (`Trainer._compile_loss`); None without one.

    Keras 3 computes a compiled model's loss through its public
    `model.compute_loss(...)`, but has no public way to ask whether `compile()`
    was given a loss, nor to create the loss's own state (one `Mean` per output
    of a multi-output model) before the first step: Keras builds it lazily,
    inside the first step, which under a distribution strategy must not
    create variables.
    """
    return getattr(model, "_compile_loss", None)


def build_compiled_loss(model: Any, y_true: Any, y_pred: Any) -> None:
    """Builds the compiled loss for labels and predictions shaped like `y_true`, `y_pred` (`CompileLoss.build`).

    Call it under the strategy's scope: the per-output loss trackers it creates
    are variables. A no-op when the model has no compiled loss or it is built.
    """
    loss = compiled_loss(model)
    if loss is not None and not loss.built:
        loss.build(y_true, y_pred)


def compiled_metrics(model: Any, y_true: Any, y_pred: Any) -> Any:
    """A new, built copy of the metrics given to `model.compile(metrics=..., weighted_metrics=...)`; None without any.

    Keras keeps them in one private `CompileMetrics` (`Trainer._compile_metrics`,
    its `_user_metrics` / `_user_weighted_metrics` as the user passed them) and
    resolves names such as "accuracy" against the labels and outputs when it
    builds it (`keras.src.trainers.compile_utils.CompileMetrics.build`). A
    training loop needs two independent sets (train and eval), and none of this
    is public. Metric objects the user passed are cloned from their config, so
    neither copy shares state with the other or with the model. The copy is a
    `keras.metrics.Metric` whose `result()` is a dict ({"accuracy": ...},
    {"out_a_accuracy": ...} per output); its variables are created here, so call
    it under the strategy's scope.
    """
    import keras
    from keras.src.trainers.compile_utils import CompileMetrics

    source = getattr(model, "_compile_metrics", None)
    if source is None:
        return None

    def clone(spec):
        if isinstance(spec, keras.metrics.Metric):
            return type(spec).from_config(spec.get_config())
        return spec

    def clone_all(specs):
        return None if specs is None else keras.tree.map_structure(clone, specs)

    copy = CompileMetrics(
        clone_all(source._user_metrics),  # noqa: SLF001
        clone_all(source._user_weighted_metrics),  # noqa: SLF001
        output_names=getattr(model, "output_names", None),
    )
    copy.build(y_true, y_pred)
    return copy


# -- warm start -------------------------------------------------------------------


def checkpoint_variable_names(prefix: str, child: str | None = None) -> dict[str, str]:
    """{checkpoint key: the variable's name when it was saved} for the variables of a TF2 checkpoint.

    With `child`, only the variables reachable from that child of the saved
    root (``model`` in the Checkpointer's layout) without passing through
    another child of the root: not the optimizer's slots, even when a
    compiled model holds the optimizer.

    A `tf.train.Checkpoint` names a value by its first place in the object
    graph (``model/_functional/_operations/1/_kernel/...``, or even
    ``optimizer/_trainable_variables/0/...``), which changes with the model's
    structure; the variable's own name (for Keras 3, its `.path`,
    ``sequential/dense/kernel``) and the graph's edges are kept only in the
    serialized `TrackableObjectGraph` proto under the reader's
    ``_CHECKPOINTABLE_OBJECT_GRAPH`` key. `tf.train.list_variables` returns keys
    and shapes only, so there is no public way to read them; warm start matches
    variables by these names.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    if child is None:
        reachable = set(range(len(graph.nodes)))
    else:
        roots = [c.node_id for c in graph.nodes[0].children if c.local_name == child]
        # Not through the root's other children: a compiled Keras model tracks its optimizer,
        # which is also the root's `optimizer`; its slots are not the model's variables.
        others = {c.node_id for c in graph.nodes[0].children if c.local_name != child}
        reachable, stack = set(roots), list(roots)
        while stack:
            for c in graph.nodes[stack.pop()].children:
                if c.node_id not in reachable and c.node_id not in others:
                    reachable.add(c.node_id)
                    stack.append(c.node_id)
    return {
        attribute.checkpoint_key: attribute.full_name.removesuffix(":0")
        for node_id in sorted(reachable)
        for attribute in graph.nodes[node_id].attributes
        if attribute.name == "VARIABLE_VALUE"
    }


# -- the coordination service (tensorflow.python.eager.context) -------------------


def coordination_service_config() -> Any | None:
    """This process's coordination service settings (leader, coordinated jobs), or None.

    Private: no public API says which task leads the coordination service that
    multi_worker_mirrored sets up, and the orderly shutdown must know it.
    """
    from tensorflow.python.eager import context

    return context.context().coordination_service


def wait_at_barrier(barrier_id: str, timeout_s: float) -> None:
    """Blocks until every coordinated task reached `barrier_id`; raises a tf.errors.OpError on
    failure (a peer died, the timeout passed, or no coordination service runs here)."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier_id, int(timeout_s * 1000))
