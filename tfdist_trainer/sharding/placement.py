"""Where shards are created: the ps devices, the bytes ledger per task, and creating a variable on a device.

- parameter_server: each shard goes to one ps task, chosen by a greedy
  bytes-balancer that knows what is already on each ps (the shards of every
  sharded layer built so far, and every variable created inside
  `record_all_variables()`). `ParameterServerStrategy` ignores `tf.device` when it
  creates a variable (its round-robin sets the device itself), so the layer
  uses the supported way to choose: `strategy.extended.colocate_vars_with(v)`
  with one tiny untracked anchor variable per ps task.
- default strategy / model parallel: with ``devices=[...]`` each shard is
  created under ``tf.device`` of a device from the list (bytes-balanced).
- mirrored / multi_worker_mirrored: every replica holds every shard
  (mirrored variables); nothing is placed here.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.variables import device_of, stored_bytes


def strategy_kind(strategy: tf.distribute.Strategy) -> str:
    """How a sharded layer sees the active strategy: 'parameter_server', 'one_device' (also no
    strategy: one copy of every variable) or 'replicated' (every replica holds every variable).

    The one place the sharding layers, which a user's model carries into any strategy, ask
    which strategy runs (issue 38: no strategy checks outside the strategies' homes but this).
    """
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return "parameter_server"
    if not tf.distribute.has_strategy() or isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return "one_device"
    return "replicated"


def strategy_gin_name(strategy: tf.distribute.Strategy) -> str:
    """The strategy as a user chose it (its gin file's name), for messages: TF's class names
    (`CollectiveAllReduceStrategy` for multi_worker_mirrored) are not what the user wrote."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker_mirrored"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    kind = strategy_kind(strategy)
    return kind if kind != "replicated" else type(strategy).__name__


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    return strategy_kind(strategy) == "parameter_server"


def ps_devices(strategy: tf.distribute.Strategy | None = None) -> list[str]:
    """The ps task devices of a ParameterServerStrategy (default: the current one); [] otherwise."""
    strategy = strategy or tf.distribute.get_strategy()
    if not is_parameter_server(strategy):
        return []
    # The coordinator is connected to the cluster, so the ps tasks' devices are listed.
    tasks = sorted(
        {task_of(d.name) for d in tf.config.list_logical_devices("CPU") if "/job:ps/" in d.name},
        key=lambda t: int(tf.DeviceSpec.from_string(t).task),
    )
    if not tasks:  # not connected yet: ask the cluster resolver
        resolver = tf_compat.cluster_resolver(strategy)
        num_ps = len(resolver.cluster_spec().as_dict().get("ps", [])) if resolver is not None else 0
        tasks = [f"/job:ps/replica:0/task:{i}" for i in range(num_ps)]
    return [f"{t}/device:CPU:0" for t in tasks]


def task_of(device: str) -> str:
    """'/job:ps/replica:0/task:1/device:CPU:0' -> '/job:ps/replica:0/task:1' (bytes are per task)."""
    if not device or device.startswith("mirrored:"):
        return device or "(unplaced)"
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None:
        return device
    return spec.replace(replica=spec.replica or 0, device_type=None, device_index=None).to_string()


class PlacementLedger:
    """Bytes already placed on each device (task), per strategy; greedy placement reads it."""

    def __init__(self):
        self._bytes: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()

    def record(self, variable: Any, device: str | None = None) -> None:
        """Counts `variable`'s bytes on its task; recording it again (or its Keras wrapper) moves it.

        A variable is known by its storage: a Keras variable and the TF variable
        it stores (what `record_all_variables` sees created) are one entry.
        """
        task = task_of(device or device_of(variable))
        stored = tf_compat.variable_storage(variable)
        key = id(stored if stored is not None else variable)
        with self._lock:
            for held in self._bytes.values():
                held.pop(key, None)
            self._bytes.setdefault(task, {})[key] = stored_bytes(variable)

    def bytes_on(self, device: str) -> int:
        return sum(self._bytes.get(task_of(device), {}).values())

    def plan(self, sizes: Sequence[int], devices: Sequence[str]) -> list[str]:
        """Greedy largest-first: each item goes to the device holding the fewest bytes so far."""
        load = {d: self.bytes_on(d) for d in devices}
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
        chosen: list[str | None] = [None] * len(sizes)
        for i in order:
            device = min(devices, key=lambda d: (load[d], devices.index(d)))
            chosen[i] = device
            load[device] += sizes[i]
        return chosen  # type: ignore[return-value]


_LEDGERS: weakref.WeakKeyDictionary[Any, PlacementLedger] = weakref.WeakKeyDictionary()
_ANCHORS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def placement_ledger(strategy: tf.distribute.Strategy | None = None) -> PlacementLedger:
    strategy = strategy or tf.distribute.get_strategy()
    key = strategy.extended
    if key not in _LEDGERS:
        _LEDGERS[key] = PlacementLedger()
    return _LEDGERS[key]


@contextlib.contextmanager
def record_all_variables():
    """Records every variable created inside it in the current strategy's placement ledger.

    Build a model inside it (under the strategy's scope) so that sharded layers
    balance their shards against *all* the variables already on each ps, not
    only against other sharded layers.
    """
    ledger = placement_ledger()

    def recorder(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        try:
            ledger.record(variable)
        except (AttributeError, ValueError, TypeError):
            pass
        return variable

    with tf.variable_creator_scope(recorder):
        yield ledger


def _ps_anchor(strategy: tf.distribute.Strategy, device: str):
    """An untracked scalar variable on the ps task `device`, to colocate new variables with."""
    anchors = _ANCHORS.setdefault(strategy.extended, {})
    target = task_of(device)
    tries = 0
    num_ps = len(ps_devices(strategy))
    while target not in anchors:
        if tries >= 2 * num_ps:
            raise RuntimeError(
                f"could not place an anchor variable on {target}; the ParameterServerStrategy "
                f"round-robin never reached it after {tries} variables."
            )
        with tf.init_scope():
            anchor = tf.Variable(0, dtype=tf.int32, trainable=False, name="tfdist_placement_anchor")
        anchors.setdefault(task_of(anchor.device), anchor)
        tries += 1
    return anchors[target]


@contextlib.contextmanager
def create_on(device: str | None, strategy: tf.distribute.Strategy):
    """Variables created inside it go to `device` (None: where the strategy puts them)."""
    if device is None:
        yield
    elif is_parameter_server(strategy):
        with strategy.extended.colocate_vars_with(_ps_anchor(strategy, device)):
            yield
    else:
        with tf.device(device):
            yield
