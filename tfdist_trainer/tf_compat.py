"""The one module allowed to touch private TensorFlow and Keras APIs (checked on TF 2.21 / Keras 3.15).

Each use is one small function whose docstring says what it relies on and why
there is no public way. tests/test_tf_compat.py exercises every one of them
against the installed TensorFlow and Keras, so an upgrade that removes or
changes one fails there, by name, instead of deep inside a training run.

TensorFlow and Keras are imported inside the functions: importing this module
starts nothing (model-parallel plans are checked before TF starts).
"""

from __future__ import annotations

import functools
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


@functools.cache
def sliced_tensor_trackable() -> type:
    """A Trackable base class whose instances a `tf.train.Checkpoint` saves as one tensor, in slices.

    A subclass sets `checkpoint_key` (the saveable's name under the object)
    and `checkpoint_dtype`, and defines `checkpoint_slices()` ([(the slice's
    `SaveSliceInfo` spec, the device to read it on)], in save order),
    `read_slice(index)` (the slice's tensor) and `restore_slices(tensors)`
    (assigns the slices a restore read, in the same order; returns an op).

    Reaches `Trackable._gather_saveables_for_checkpoint` and a
    `SaveableObject` of one `SaveSpec` per slice (`saveable_classes`), as TF's
    own `ShardedVariable` does: the only way to save one logical tensor from
    several variables so that a restore may ask for another slicing. TF has
    no public hook for an object to supply its own saved tensors.
    """
    trackable = trackable_base()
    saveable_object, save_spec = saveable_classes()

    class SlicedTensorSaveable(saveable_object):
        def __init__(self, owner, name: str):
            self._owner = owner
            specs = [
                save_spec(
                    (lambda index=index: owner.read_slice(index)),
                    spec,
                    name,
                    dtype=owner.checkpoint_dtype,
                    device=device,
                )
                for index, (spec, device) in enumerate(owner.checkpoint_slices())
            ]
            super().__init__(None, specs, name)

        def restore(self, restored_tensors, restored_shapes):
            del restored_shapes
            return self._owner.restore_slices(restored_tensors)

    class SlicedTensorTrackable(trackable):
        checkpoint_key = "tensor"
        checkpoint_dtype: Any = None

        def _gather_saveables_for_checkpoint(self):
            return {self.checkpoint_key: lambda name: SlicedTensorSaveable(self, name)}

    return SlicedTensorTrackable


class ReplacesCheckpointChildren:
    """Mixin for a Keras layer or optimizer: `checkpoint_children(children)` chooses what a checkpoint saves under it.

    Overrides `Trackable._trackable_children(save_type)`, the hook through
    which `tf.train.Checkpoint` asks an object for its children: the
    object's tracked attributes by name, passed to `checkpoint_children`,
    which returns the {name: Trackable} to save instead. A SavedModel export
    asks `saved_model_children` (default: the tracked attributes), e.g. for a
    resource the serving function uses that Keras does not track. TF has no
    public way for an object to change its children (`tf.Module` and Keras
    track every attribute).
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "checkpoint":
            return self.checkpoint_children(children)
        return self.saved_model_children(children)

    def checkpoint_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return children

    def saved_model_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return children


# -- SavedModel export -------------------------------------------------------------


def export_archive_of(model: Any) -> Any:
    """A `keras.export.ExportArchive` serving `model`'s call as ``serve``, each weight saved once.

    `model.export(format="tf_saved_model")` builds the same archive, but its
    SavedModel holds every weight twice: once under ``variables/N`` (the
    archive's lists of the tracked layer's Keras variables, each a trackable
    of its own) and once under ``_all_variables/N`` (the TF variables the
    endpoint captures). Measured on Keras 3 / TF 2.21: 12.8 MB of variables
    for a 6.4 MB table; 8.0 GB for the 4.0 GB click model. The lists here hold
    the TF variables themselves, which the SavedModel then saves once (1.0x).
    Keras has no public switch for it; the input signature is the one
    `model.export` infers (`keras.src.export.export_utils`).
    """
    import keras
    from keras.src.export.export_utils import get_input_signature

    archive = keras.export.ExportArchive()
    archive.track_and_add_endpoint("serve", model, get_input_signature(model))
    tracked = archive._tf_trackable  # noqa: SLF001
    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        setattr(tracked, name, [variable_storage(v) for v in getattr(tracked, name)])
    return archive


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


def stored_dtype(variable: Any) -> Any:
    """The dtype a Keras variable stores (`KerasVariable._dtype`), even before its storage exists; else None.

    Inside a mixed-precision layer call Keras' public `dtype` is the autocast
    dtype (float16), not the stored float32; a deferred variable (created in
    a `StatelessScope`) has no storage to ask. Any other object's `_dtype`
    (a tf.Variable's) is its dtype as well.
    """
    return getattr(variable, "_dtype", None)


def distributed_components(value: Any) -> tuple:
    """The per-device components of a mirrored (distributed) variable (`DistributedValues._values`); () otherwise.

    The public `strategy.experimental_local_results(value)` needs the
    strategy that made the value; a variable's device report has only the
    variable.
    """
    return tuple(getattr(value, "_values", ()))


def local_component(variable: Any) -> Any:
    """The TF variable this replica (or this update) reads: a mirrored variable's component here.

    `tf.gather` on a plain resource variable is a `ResourceGather`: only the
    rows asked for are read. On a `MirroredVariable` (mirrored,
    multi_worker_mirrored) it is a `ReadVariableOp` of the whole table and then
    a `GatherV2`: every lookup reads every row (issue 36). Gathering from the
    component on the current replica's device (`_get_on_device_or_primary`: by
    replica id in a replica context, by device in an update) reads the rows
    only; the tape sees the same handle, so the gradient is still the
    variable's `IndexedSlices`. TF has no public accessor for the component.
    """
    stored = variable_storage(variable)
    if distributed_components(stored):
        return stored._get_on_device_or_primary()  # noqa: SLF001
    return stored


def sparse_read(variable: Any, ids: Any) -> Any:
    """Rows `ids` of `variable` (Keras or TF, plain or mirrored), reading only those rows."""
    import tensorflow as tf

    return tf.gather(local_component(variable), ids)


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


def moving_averages(optimizer: Any) -> list:
    """The EMA copies of the model's variables a `use_ema=True` optimizer keeps, in the order of the
    variables it was built for (`BaseOptimizer._model_variables_moving_average`); [] otherwise.

    Keras exposes them only through `finalize_variable_values`, which overwrites the
    model's weights for good (what `fit` does at its end); evaluating or exporting the
    averages during training, then going on with the raw weights, needs the copies.
    """
    if not getattr(optimizer, "use_ema", False):
        return []
    return list(getattr(optimizer, "_model_variables_moving_average", None) or [])


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


def optimizer_model_variables(optimizer: Any) -> list:
    """The variables a Keras optimizer was built for (`BaseOptimizer._trainable_variables`); [] before `build`.

    `optimizer.variables` is its own state (iterations, learning rate,
    slots); Keras 3 has no public list of the variables it updates.
    """
    return list(getattr(optimizer, "_trainable_variables", ()))


#: The checkpoint children of a Keras 3 optimizer that hold its step count and learning rate.
OPTIMIZER_SCALAR_CHILDREN = ("_iterations", "_learning_rate")


def optimizer_scalar_children(children: dict[str, Any]) -> dict[str, Any]:
    """Of a Keras optimizer's checkpoint children, those that hold its iterations and learning rate.

    Keras 3 names them after its private attributes (`_iterations`,
    `_learning_rate`); a checkpoint that saves the rest of the optimizer's
    state by another layout keeps these two under their own names, so
    `iterations` restores from a stock optimizer's checkpoint. Children that
    are not Trackables are left out.
    """
    trackable = trackable_base()
    return {
        name: child
        for name, child in children.items()
        if name in OPTIMIZER_SCALAR_CHILDREN and isinstance(child, trackable)
    }


def adagrad_accumulator(optimizer: Any, variable: Any) -> Any:
    """The accumulator slot of `variable` in a Keras 3 Adagrad (`_accumulators[_get_variable_index(v)]`).

    Keras 3 keeps an optimizer's slots in private per-optimizer lists
    indexed by its own variable index; there is no public way to ask for the
    slot of one variable.
    """
    return optimizer._accumulators[optimizer._get_variable_index(variable)]  # noqa: SLF001


def replace_gradient_all_reduce(optimizer: Any, all_reduce: Callable[[Any, list], list]) -> None:
    """Makes the Keras 3 optimizer (and a loss-scale optimizer's inner one) sum the replicas'
    gradients with `all_reduce(replica_context, gradients)` instead of one `all_reduce` call.

    Keras sums them in `_all_reduce_sum_gradients(grads_and_vars)` (backend/tensorflow/
    optimizer.py) inside `apply_gradients`, with None gradients left out; it has no public
    way to choose how. Outside a replica context nothing is reduced, as in Keras.
    """
    import tensorflow as tf

    def all_reduce_sum_gradients(grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        context = tf.distribute.get_replica_context()
        present = [i for i, (g, _) in enumerate(grads_and_vars) if g is not None]
        if context is None or not present:
            return grads_and_vars
        reduced = all_reduce(context, [grads_and_vars[i][0] for i in present])
        result = list(grads_and_vars)
        for i, g in zip(present, reduced):
            result[i] = (g, grads_and_vars[i][1])
        return result

    for target in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if target is not None:
            target._all_reduce_sum_gradients = all_reduce_sum_gradients  # noqa: SLF001


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


# -- distribution strategies and graphs ---------------------------------------------


def cluster_resolver(strategy: Any) -> Any:
    """The strategy's cluster resolver: its public `cluster_resolver`, else `strategy._cluster_resolver`; or None.

    TF 2.21's public `Strategy.cluster_resolver` reads
    `strategy.extended._cluster_resolver`, which a ParameterServerStrategy's
    extended object never sets (it keeps the resolver on the strategy
    itself), so for that strategy the public property is None.
    """
    return getattr(strategy, "cluster_resolver", None) or getattr(
        strategy, "_cluster_resolver", None
    )


def graph_functions(graph: Any) -> list:
    """The function graphs defined in a `tf.Graph` (`Graph._functions`: loop bodies, branches, calls).

    A traced step's `tf.while_loop` body lives in such a function; the
    public `graph.as_graph_def().library` holds their FunctionDefs, not graphs
    whose ops can be inspected.
    """
    return [
        f.graph
        for f in getattr(graph, "_functions", {}).values()
        if getattr(f, "graph", None) is not None
    ]


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
