"""Private Keras optimizer and metric APIs: slots, averages, the gradient all-reduce, atomic updates.

A trainer that owns its loop must do what Keras' `fit` does with the optimizer's private
state (EMA weights, model variables, the scalar children of a checkpoint) and change how
it reduces gradients (sparse gradients in one all-gather) and updates metrics (atomically
under parameter_server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from tfdist_trainer.tf_compat.checkpoints import trackable_base
from tfdist_trainer.tf_compat.keras_variables import in_stateless_scope, variable_storage


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


def optimizer_variable(optimizer: Any, variable: Any) -> Any:
    """The Keras variable an optimizer updates, given what its `update_step` was handed.

    Keras 3's TF backend hands `update_step` the TF variable that stores a Keras
    variable (`_backend_update_step` unwraps `.value`), so attributes set on the
    Keras variable are not on it; the optimizer's private index maps one to the
    other. Anything the optimizer does not train is returned as it is.
    """
    try:
        return optimizer._trainable_variables[optimizer._get_variable_index(variable)]  # noqa: SLF001
    except (KeyError, IndexError, AttributeError):
        return variable


def _with_inner(optimizer: Any) -> list:
    """The optimizer, and a loss-scale optimizer's inner one (whose `apply` does the work)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    return [optimizer] if inner is None else [optimizer, inner]


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

    for target in _with_inner(optimizer):
        target._all_reduce_sum_gradients = all_reduce_sum_gradients  # noqa: SLF001


def read_learning_rate_once(optimizer: Any) -> None:
    """Makes each apply of the Keras 3 optimizer (and a loss-scale optimizer's inner one) read
    its learning rate once, for all its variables' updates.

    Keras hands the learning-rate *variable* to every variable's `update_step`
    (`_backend_update_step(grads, variables, self.learning_rate)`, backend/tensorflow/
    optimizer.py), which casts it: one read per variable. Under parameter_server each
    update runs on its variable's ps and the learning rate lives on one ps, so every
    read is a transfer: 56 of the click model's 109 a step (TF's profiler, 52 shards).
    Read once, the tensor crosses to each ps once. Keras has no public hook between
    `apply` and the per-variable updates.
    """
    import tensorflow as tf

    for target in _with_inner(optimizer):
        update = target._backend_update_step  # noqa: SLF001

        def update_with_one_read(grads, variables, learning_rate, update=update):
            return update(grads, variables, tf.convert_to_tensor(learning_rate))

        target._backend_update_step = update_with_one_read  # noqa: SLF001


def make_metric_updates_atomic(metrics: Sequence[Any]) -> None:
    """Makes every accumulation into the metrics' variables one atomic TF `assign_add`
    (`make_accumulations_atomic`)."""
    make_accumulations_atomic([v for metric in metrics for v in metric.variables])


def make_optimizer_steps_atomic(optimizer: Any) -> None:
    """Makes the optimizer's step count (`iterations.assign_add(1)` at each apply, and a
    loss-scale optimizer's inner one) one atomic TF `assign_add` (`make_accumulations_atomic`):
    concurrent parameter_server workers would lose steps of a learning-rate schedule."""
    make_accumulations_atomic([target.iterations for target in _with_inner(optimizer)])


def make_accumulations_atomic(variables: Sequence[Any]) -> None:
    """Makes every accumulation into these Keras variables one atomic TF `assign_add` on their storage.

    Keras 3 accumulates in two ways, both a read and a write: `Variable.assign_add(x)` is
    `assign(self + x)` (`Mean`, `Sum`, the accuracies, an optimizer's `iterations`), and
    the confusion-matrix metrics (AUC, Precision, Recall, TruePositives...) call
    `variable.assign(variable + x)` themselves (`metrics_utils.
    update_confusion_matrix_variables`). Two parameter_server workers updating the same ps
    variable at once lose one update (accuracy can exceed 1), and each update is two
    transfers. TF's own `assign_add` on the stored tf.Variable is atomic on the ps and
    sends `x` alone. Keras has no public switch for it, so each variable gets an
    `assign_add` that is TF's, and an `assign` that recognises the sum its own `+` just
    made (`_IncrementTracking`) and adds `x` instead of writing the sum.
    """
    import tensorflow as tf

    for variable in variables:
        backing = variable_storage(variable)
        if isinstance(backing, tf.Variable) and backing is not variable:
            variable.assign_add = lambda value, b=backing: b.assign_add(tf.cast(value, b.dtype))
            if not isinstance(variable, _IncrementTracking):
                variable.__class__ = _increment_tracking(type(variable))


class _IncrementTracking:
    """Mixed into a Keras metric variable's class: `v.assign(v + x)` becomes `assign_add(x)`.

    `v + x` (Keras' `__add__`) remembers its result and `x`; an `assign` of exactly that
    result (the same tensor object, next in the same thread: only the last sum is kept)
    adds `x` to the stored variable. Any other `assign` (a reset, a stateless scope) is
    Keras' own.
    """

    def __add__(self, other):
        total = super().__add__(other)
        _last_sum.value = (self, total, other)
        return total

    def __radd__(self, other):
        total = super().__radd__(other)
        _last_sum.value = (self, total, other)
        return total

    def assign(self, value):
        import tensorflow as tf

        last, _last_sum.value = getattr(_last_sum, "value", None), None
        if last is None or last[0] is not self or last[1] is not value:
            return super().assign(value)
        increment = tf.convert_to_tensor(last[2])
        if in_stateless_scope() or increment.shape != tf.TensorShape(self.shape):
            return super().assign(value)
        stored = variable_storage(self)
        stored.assign_add(tf.cast(increment, stored.dtype))
        return value


_last_sum = threading.local()  # (variable, v + x, x) of this thread's last `v + x`
_TRACKING_CLASSES: dict[type, type] = {}


def _increment_tracking(cls: type) -> type:
    """`cls` with `_IncrementTracking` mixed in (one subclass per Keras variable class)."""
    if cls not in _TRACKING_CLASSES:
        _TRACKING_CLASSES[cls] = type(
            f"IncrementTracking{cls.__name__}", (_IncrementTracking, cls), {}
        )
    return _TRACKING_CLASSES[cls]
