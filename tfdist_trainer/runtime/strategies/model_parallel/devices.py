"""Putting a layer's ops and variables on a device, also under a data-parallel strategy.

The placement decides which device each layer runs on; this module is how a decision becomes
true. docs/design.md: variables land on the device current when a layer is *built*, so a layer's
build and call run inside `on_device`; variables created elsewhere anyway are re-created on
their device (`move_variable`) or, when Keras deferred them, initialized there
(`defer_to_device`). The private Keras/TF details go through `tfdist_trainer.tf_compat`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tfdist_trainer import tf_compat


def same_device(actual: str, wanted: str) -> bool:
    """Whether a variable's device is the planned one (type and index; job/task when both name them)."""
    import tensorflow as tf

    a, w = tf.DeviceSpec.from_string(actual or ""), tf.DeviceSpec.from_string(wanted or "")
    if (a.device_type or "").upper() != (w.device_type or "").upper():
        return False
    if (a.device_index or 0) != (w.device_index or 0):
        return False
    if a.job and w.job and a.job != w.job:
        return False
    return a.task is None or w.task is None or a.task == w.task


class _Devices:
    """What a MirroredStrategy's variable creator reads from `colocate_with`: the devices of the copies."""

    def __init__(self, devices: Sequence[str]):
        self._devices = tuple(devices)


@contextlib.contextmanager
def on_device(device: str | None) -> Iterator[None]:
    """Ops and variables created inside land on `device`.

    Under a Mirrored/MultiWorkerMirrored strategy (model_parallel.data_parallel), the
    strategy's creator pins each variable to the replica's device whatever the
    device scope; passing ``colocate_with`` with our device keeps the variable
    mirrored (all-reduced, broadcast at creation) but puts this worker's copy on
    the planned device.
    """
    if device is None:
        yield
        return
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    mirrored = isinstance(
        strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    )
    with tf.device(device):
        if not mirrored or len(strategy.extended.worker_devices) != 1:
            yield
            return

        def creator(next_creator, **kwargs):
            if kwargs.get("colocate_with") is None:
                kwargs["colocate_with"] = _Devices([device])
            return next_creator(**kwargs)

        with tf.variable_creator_scope(creator):
            yield


def move_variable(kvar: Any, device: str) -> None:
    """Re-creates a built Keras variable's storage on `device` (same value, name and flags)."""
    import tensorflow as tf

    old = tf_compat.variable_storage(kvar)
    if old is None:
        return
    with tf.init_scope():
        value = tf.identity(old.read_value() if hasattr(old, "read_value") else old)
        with on_device(device):
            tf_compat.recreate_variable_storage(kvar, value)


def defer_to_device(kvar: Any, device_fn: Callable[[], str | None]) -> None:
    """A variable Keras deferred (created in a StatelessScope) is initialized on its layer's device."""
    if (
        getattr(kvar, "_tfdist_deferred_placed", False)
        or tf_compat.variable_storage(kvar) is not None
    ):
        return
    import tensorflow as tf

    @contextlib.contextmanager
    def on_layer_device():
        with tf.init_scope(), on_device(device_fn()):
            yield

    if tf_compat.wrap_deferred_initializer(kvar, on_layer_device):
        kvar._tfdist_deferred_placed = True
