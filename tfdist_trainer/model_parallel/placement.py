"""Model-parallel placement: which device each layer of a model, at any depth, builds and runs on.

A *plan* maps layers to device indices:

- a dict ``{'embed': 0, 'block_[0-1]': 0, 'block_[2-3]': 1, 'head': 1}`` or a list of
  ``(regex, index)`` pairs. A regex is matched (``re.fullmatch``) against a layer's
  path: its name for a layer of the model, ``parent/child`` for a nested one
  (``gpt2_backbone/transformer_layer_1``). The first pattern that matches wins; a
  nested layer no pattern matches runs where its parent runs, a top-level one with
  the layer before it.
- ``'auto'``: contiguous stages in call order, balanced by parameter bytes. A layer
  holding more than a device's share (a keras-hub backbone, a list of blocks) is
  split into its sublayers, recursively, until the stages balance within 10% or
  only leaf layers are left (`plan.model_parallel_plan.auto_stages`).

The model is seen as a tree (`LayerTree`): Keras' tracked sublayers, each layer
once, at the path where it was first found. A layer reached twice (keras-hub's
token embedding, reused as the language-model head: tied weights) is placed once,
with its owner; its second use runs on the owner's device too, and the table says
so. Call order, not attribute order, orders the stages: every layer's ``call`` is
wrapped, and the model's first eager call records in which order they run.

`Placement.apply` wraps each layer's ``build`` and ``call`` so that both its
variables and its forward ops live on the layer's device (DESIGN.md: variables land
on the device current when a layer is *built*). Variables created elsewhere anyway
-- a model built before it reached the strategy (every functional model), an
``'auto'`` plan (sizes are known only once the model is built), or a lazy build
Keras deferred -- are moved to their device at `finalize`, before the optimizer
creates its slots next to them. The training step is `model_parallel.step`.

Plans are parsed and checked before TF starts, by `tfdist_trainer.plan.model_parallel_plan`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.model_parallel import layer_table
from tfdist_trainer.plan.model_parallel_plan import AUTO, Rule, auto_stages, short_device
from tfdist_trainer.variables import device_of, format_bytes, stored_bytes

#: A device holding less than this fraction of its fair share of bytes is worth a warning.
UNDERUSED_SHARE = 0.5


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


# -- placing variables --------------------------------------------------------------


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


def _move_variable(kvar: Any, device: str) -> None:
    """Re-creates a built Keras variable's storage on `device` (same value, name and flags)."""
    import tensorflow as tf

    old = tf_compat.variable_storage(kvar)
    if old is None:
        return
    with tf.init_scope():
        value = tf.identity(old.read_value() if hasattr(old, "read_value") else old)
        with on_device(device):
            tf_compat.recreate_variable_storage(kvar, value)


def _defer_to_device(kvar: Any, device_fn: Callable[[], str | None]) -> None:
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


def _children(layer: Any) -> list:
    import keras

    return [
        c
        for c in tf_compat.sublayers(layer, recursive=False)
        if not isinstance(c, keras.layers.InputLayer)
    ]


# -- the layer tree -------------------------------------------------------------------


class Node:
    """One layer of the model's tree: where it sits, what it holds, where it runs.

    Attributes:
      path: 'parent/child' from the model down (the first path Keras' tracking reaches it by).
      aliases: every path that reaches the same layer (a tied layer has several); plans match any.
      children: its sublayers, in call order once the model has been called.
      index: the device index it opens a scope for (None: it runs where its caller runs).
      unit: whether it is a row of the placement table (a piece of a stage).
      rule: the plan rule that named it (explicit plans).
      first_call, last_call: the order of its first and last call in the recorded forward pass.
      reused_by: paths of layers other than its parent that call it (tied weights).
    """

    def __init__(self, layer: Any, path: str, parent: Node | None):
        self.layer = layer
        self.path = path
        self.aliases = [path]
        self.parent = parent
        self.children: list[Node] = []
        self.own_variables: list = []
        self.index: int | None = None
        self.unit = False
        self.rule: Rule | None = None
        self.first_call: int | None = None
        self.last_call: int | None = None
        self.reused_by: list[str] = []

    @property
    def depth(self) -> int:
        return self.path.count("/")

    @property
    def own_bytes(self) -> int:
        return sum(stored_bytes(v) for v in self.own_variables)

    @functools.cached_property
    def total_bytes(self) -> int:
        """Its own bytes and its sublayers' (cached: read only after the variables are final)."""
        return self.own_bytes + sum(child.total_bytes for child in self.children)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


class LayerTree:
    """A model's layers as a tree, each layer once (see the module docstring)."""

    def __init__(self, model: Any):
        self.root = Node(model, "", None)
        self._by_id: dict[int, Node] = {id(model): self.root}
        self.grow()

    def grow(self) -> list[Node]:
        """Adds the layers not seen yet (a lazy build creates some); returns the new nodes."""
        new: list[Node] = []

        def visit(parent: Node) -> None:
            for layer in _children(parent.layer):
                path = f"{parent.path}/{layer.name}" if parent.path else layer.name
                known = self._by_id.get(id(layer))
                if known is not None:
                    if path not in known.aliases:
                        known.aliases.append(path)
                    continue
                node = Node(layer, path, parent)
                parent.children.append(node)
                self._by_id[id(layer)] = node
                new.append(node)
                visit(node)

        for node in list(self.root.walk()):
            visit(node)
        return new

    def nodes(self) -> list[Node]:
        """Every layer below the model, depth-first."""
        return list(self.root.walk())[1:]

    def assign_variables(self) -> None:
        """Each variable belongs to the deepest layer that holds it (a tied one to one owner)."""
        seen: set[int] = set()
        for node in sorted(self.root.walk(), key=lambda n: -n.depth if n.path else 1):
            node.own_variables = [v for v in node.layer.variables if id(v) not in seen]
            seen.update(id(v) for v in node.own_variables)

    def order_by_calls(self) -> None:
        """Children in the order of their first call (never-called layers last, in tracking order)."""
        for node in self.root.walk():
            node.children.sort(key=lambda n: math.inf if n.first_call is None else n.first_call)


# -- the placement --------------------------------------------------------------------


class Placement:
    """Places one model's layers on `devices` following `plan` (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        plan: str | list[Rule],
        devices: Sequence[str],
        *,
        host_device: str | None = None,
        require_balance: bool = False,
        log: Callable[[str], None] | None = None,
    ):
        self.model = model
        self.plan = plan
        self.devices = list(devices)
        self.host_device = host_device
        self.require_balance = require_balance
        self.tree: LayerTree | None = None
        self.finalized = False
        self.moved: list[str] = []
        self.warnings: list[str] = []
        self._log = log or (lambda line: None)
        self._calls = itertools.count()
        self._stack: list[Node] = []

    @property
    def units(self) -> list[Node]:
        """The table's rows: the pieces of the stages, in call order."""
        if self.tree is None:
            return []
        units = [n for n in self.tree.nodes() if n.unit]
        return sorted(units, key=lambda n: math.inf if n.first_call is None else n.first_call)

    # -- choosing ------------------------------------------------------------
    def _check_has_layers(self) -> None:
        if not self.tree.root.children:
            raise ConfigError(
                f"model_parallel needs a model made of layers, but {self.model.name!r} has no "
                f"sublayers; build it from layers (Sequential, functional, or sublayers of a Model)."
            )

    def _assign_rules(self) -> None:
        """An explicit plan: the first rule matching any of a layer's paths gives its device."""
        used: set[int] = set()
        for node in self.tree.nodes():
            for n, rule in enumerate(self.plan):
                if any(rule.matches(path) for path in node.aliases):
                    used.add(n)
                    node.rule, node.index, node.unit = rule, rule.index, True
                    break
        previous = 0
        for node in self.tree.root.children:  # an unnamed top-level layer follows the one before
            if node.index is None:
                node.index, node.unit = previous, True
            previous = node.index
        unused = [rule.pattern for n, rule in enumerate(self.plan) if n not in used]
        if unused:
            paths = [n.path for n in self.tree.nodes() if n.depth <= 1]
            raise ConfigError(
                f"model_parallel.plan pattern {unused[0]!r} matches no layer of model "
                f"{self.model.name!r} at any depth (its layers, two levels deep: "
                f"{', '.join(repr(p) for p in paths)}); fix the pattern or remove it."
            )

    def _assign_auto(self) -> None:
        pieces = [n for n in self.tree.nodes() if n.own_bytes > 0]
        if len(pieces) < len(self.devices):
            raise ConfigError(
                f"model_parallel.num_devices={len(self.devices)} but model {self.model.name!r} has "
                f"only {len(pieces)} layer(s) holding variables, at any depth, to spread over them; "
                f"set model_parallel.num_devices <= {len(pieces)}."
            )
        items, stages = auto_stages(self.tree.root.children, len(self.devices))
        for item, stage in zip(items, stages):
            item.node.index = stage
            item.node.unit = not item.own or item.node.own_bytes > 0

    def scope_device(self, node: Node) -> str | None:
        """The device scope `node`'s build and call open (None: they run where the caller runs)."""
        if node.index is not None:
            return self.devices[node.index]
        if not self.finalized and self.plan == AUTO and node.depth == 0:
            return self.host_device  # 'auto' before the sizes are known: build on the host
        return None

    def device_index(self, node: Node) -> int:
        """The device a layer's variables live on: its own index, else its nearest placed parent's."""
        while node is not None:
            if node.index is not None:
                return node.index
            node = node.parent
        return 0

    # -- wrapping ------------------------------------------------------------
    def apply(self) -> Any:
        """Wraps every layer's build and call; returns the model. Call `finalize` after its first call."""
        self.tree = LayerTree(self.model)
        self._check_has_layers()
        if self.plan != AUTO:
            self._assign_rules()
        for node in self.tree.nodes():
            self._wrap(node)
        return self.model

    def _record_call(self, node: Node) -> None:
        rank = next(self._calls)
        if node.first_call is None:
            node.first_call = rank
        node.last_call = rank
        caller = self._stack[-1] if self._stack else self.tree.root
        if caller is not node.parent and caller is not node:
            who = caller.path or self.model.name
            if who not in node.reused_by:
                node.reused_by.append(who)

    def _wrap(self, node: Node) -> None:
        layer = node.layer
        placement = self
        original_build, original_call = layer.build, layer.call

        def tag_deferred():
            for v in layer.variables:
                _defer_to_device(v, lambda: placement.scope_device(node))

        @functools.wraps(original_build)
        def build(*args, **kwargs):
            with on_device(placement.scope_device(node)):
                result = original_build(*args, **kwargs)
            tag_deferred()
            return result

        @functools.wraps(original_call)
        def call(*args, **kwargs):
            placement._record_call(node)
            placement._stack.append(node)
            try:
                with on_device(placement.scope_device(node)):
                    result = original_call(*args, **kwargs)
            finally:
                placement._stack.pop()
            if not placement.finalized:
                tag_deferred()
            return result

        layer.build = build
        layer.call = call

    # -- after the first call ------------------------------------------------
    def finalize(self) -> None:
        """Runs once the model is built and called: 'auto' stages, moves, balance check, tables."""
        if self.finalized:
            return
        for (
            node
        ) in self.tree.grow():  # layers a lazy build created: they run where their parent runs
            self._wrap(node)
        self.tree.order_by_calls()
        self.tree.assign_variables()
        if self.plan == AUTO:
            self._assign_auto()
        for node in self.tree.root.walk():
            device = self.devices[self.device_index(node)]
            for v in node.own_variables:
                if tf_compat.variable_storage(v) is None:
                    continue
                if not same_device(device_of(v), device):
                    _move_variable(v, device)
                    self.moved.append(v.path)
        self.finalized = True
        if self.moved:
            why = (
                "'auto' sizes layers after building them"
                if self.plan == AUTO
                else "they were built before placement, or lazily outside their layer's build()"
            )
            self._log(
                f"model_parallel moved {len(self.moved)} variable(s) to their planned device after the "
                f"model was built ({why})"
            )
        for line in self.stage_lines():
            self._log(line)
        layer_table.log(self.table_lines())
        self._check_balance()

    def _check_balance(self) -> None:
        """A device with less than half its fair share: one warning naming what to split (or an error)."""
        totals = [d["bytes"] for d in self.per_device()]
        fair = sum(totals) / len(totals)
        short = [i for i, t in enumerate(totals) if t < UNDERUSED_SHARE * fair]
        if not short or fair == 0:
            return
        units = self.units
        largest = max(units, key=lambda n: self._unit_bytes(n))
        if largest.children:
            child = next((c for c in largest.children if c.total_bytes > 0), largest.children[0])
            how = (
                f"split it with a nested pattern, e.g. model_parallel.plan = "
                f"{{'{child.path}': {short[0]}, ...}}"
            )
        else:
            how = (
                "a single layer's variables stay on one device: use fewer devices, or a layer "
                "that shards itself (tfdist_trainer.sharding)"
            )
        i = short[0]
        message = (
            f"model_parallel: device {short_device(self.devices[i])} holds "
            f"{100.0 * totals[i] / sum(totals):.0f}% of the parameter bytes (fair share "
            f"{100.0 / len(totals):.0f}%); the largest layer placed whole is {largest.path!r} "
            f"({format_bytes(self._unit_bytes(largest))}): {how}"
        )
        if self.require_balance:
            raise ConfigError(
                f"{message}; or set model_parallel.require_balance = False to train unbalanced."
            )
        self.warnings.append(message)
        logging.warning("%s", message)

    def misplaced(self) -> list[tuple[str, str, str]]:
        """(variable path, actual device, planned device) of every variable not where the plan puts it."""
        wrong = []
        for node in self.tree.root.walk():
            device = self.devices[self.device_index(node)]
            for v in node.own_variables:
                actual = device_of(v)
                if not same_device(actual, device):
                    wrong.append((v.path, actual, device))
        return wrong

    def loss_device(self) -> str | None:
        """Where the model's output is made: the device of the placed layer that ran last."""
        called = [n for n in self.units if n.last_call is not None]
        if not called:
            return None
        last = max(called, key=lambda n: n.last_call)
        return self.devices[self.device_index(last)]

    # -- reporting -----------------------------------------------------------
    def _unit_variables(self, unit: Node) -> list:
        """A row's variables: its own and those of every sublayer that runs inside its scope."""
        found = []
        for node in unit.walk():
            if node is unit or self._placed_by(node) is unit:
                found.extend(node.own_variables)
        return found

    def _placed_by(self, node: Node) -> Node | None:
        while node is not None and not node.unit:
            node = node.parent
        return node

    def _unit_bytes(self, unit: Node) -> int:
        return sum(stored_bytes(v) for v in self._unit_variables(unit))

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for unit in self.units:
            variables = self._unit_variables(unit)
            rows.append(
                {
                    "layer": unit.path,
                    "device_index": unit.index,
                    "device": self.devices[unit.index] if unit.index is not None else None,
                    "rule": unit.rule.pattern if unit.rule else None,
                    "params": sum(int(math.prod(int(d) for d in v.shape)) for v in variables),
                    "bytes": sum(stored_bytes(v) for v in variables),
                    "reused_by": list(unit.reused_by),
                    "variables": [{"name": v.path, "device": device_of(v)} for v in variables],
                }
            )
        return rows

    def per_device(self) -> list[dict[str, Any]]:
        totals = [
            {"device_index": i, "device": d, "params": 0, "bytes": 0, "layers": []}
            for i, d in enumerate(self.devices)
        ]
        for row in self.rows():
            if row["device_index"] is None:
                continue
            total = totals[row["device_index"]]
            total["params"] += row["params"]
            total["bytes"] += row["bytes"]
            total["layers"].append(row["layer"])
        return totals

    def _plan_text(self) -> str:
        if self.plan == AUTO:
            return (
                "'auto' (contiguous stages in call order, nested layers split, balanced by bytes)"
            )
        return repr(self.plan)

    def stage_lines(self) -> list[str]:
        """The console's view: one line per device (first and last layer, params, bytes, share)."""
        per_device = self.per_device()
        total = sum(d["bytes"] for d in per_device) or 1
        lines = [
            f"model_parallel placement over {len(self.devices)} device(s), plan {self._plan_text()}:"
        ]
        for d in per_device:
            layers = d["layers"]
            span = (
                "no layers"
                if not layers
                else layers[0]
                if len(layers) == 1
                else f"{layers[0]} .. {layers[-1]} ({len(layers)} pieces)"
            )
            lines.append(
                f"  {short_device(d['device'])}: {span}; {d['params']:,} params, "
                f"{format_bytes(d['bytes'])} ({100.0 * d['bytes'] / total:.0f}%)"
            )
        for unit in self.units:
            if unit.reused_by:
                lines.append(
                    f"  {unit.path} is also called by {', '.join(unit.reused_by)} (tied weights): "
                    f"that call runs on its owner's device {short_device(self.devices[unit.index])}"
                )
        return lines

    def table_lines(self) -> list[str]:
        """The task log's view: one row per placed piece."""
        rows = self.rows()
        table = [
            (
                r["layer"],
                f"{r['params']:,}",
                format_bytes(r["bytes"]),
                short_device(r["device"])
                + (
                    ""
                    if r["rule"] or self.plan == AUTO or "/" in r["layer"]
                    else "  (no pattern: follows the layer before)"
                ),
            )
            for r in rows
        ]
        return [
            f"model_parallel placement, layer by layer (plan {self._plan_text()}):",
            *layer_table.format_rows(("layer", "params", "bytes", "device"), table),
        ]

    def report(
        self, *, optimizer: Any = None, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The placement as a JSON-able dict: layers, their variables' real devices, totals per device."""
        payload: dict[str, Any] = {
            "devices": self.devices,
            "plan": AUTO if self.plan == AUTO else [[r.pattern, r.index] for r in self.plan],
            "layers": self.rows(),
            "per_device": self.per_device(),
            "moved_after_build": self.moved,
            "misplaced": [list(m) for m in self.misplaced()],
            "warnings": self.warnings,
        }
        if optimizer is not None:
            payload["optimizer_variables"] = [
                {"name": getattr(v, "path", getattr(v, "name", "?")), "device": device_of(v)}
                for v in optimizer.variables
            ]
        payload.update(extra or {})
        return payload
