"""Private Keras/TF variable APIs: a Keras variable's TF storage, its replicas, its layers.

Model-parallel placement moves a built variable's storage to another device and places
variables Keras deferred; the sharded tables read one replica's component. Keras 3 hides
the `tf.Variable` behind its own variable, and TF the replica components behind
distributed values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any


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
