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

The model is seen as a tree (`layer_tree.LayerTree`): Keras' tracked sublayers, each layer
once, at the path where it was first found. A layer reached twice (keras-hub's
token embedding, reused as the language-model head: tied weights) is placed once,
with its owner; its second use runs on the owner's device too, and the table says
so. Call order, not attribute order, orders the stages: every layer's ``call`` is
wrapped, and the model's first eager call records in which order they run.

`Placement.apply` wraps each layer's ``build`` and ``call`` so that both its
variables and its forward ops live on the layer's device (docs/design.md: variables land
on the device current when a layer is *built*). Variables created elsewhere anyway
-- a model built before it reached the strategy (every functional model), an
``'auto'`` plan (sizes are known only once the model is built), or a lazy build
Keras deferred -- are moved to their device at `finalize`, before the optimizer
creates its slots next to them. The training step is `step`.

The tree is `layer_tree`, putting a layer on its device is `devices`, and what the placement
says about itself (console lines, the log's table, placement.json) is `placement_report`.

Plans are parsed and checked before TF starts, by `tfdist_trainer.plan.model_parallel_plan`.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.model_parallel_plan import AUTO, Rule, auto_stages, short_device
from tfdist_trainer.runtime.logs import layer_table
from tfdist_trainer.runtime.strategies.model_parallel.devices import (
    defer_to_device,
    move_variable,
    on_device,
    same_device,
)
from tfdist_trainer.runtime.strategies.model_parallel.layer_tree import LayerTree, Node
from tfdist_trainer.runtime.strategies.model_parallel.placement_report import PlacementReport
from tfdist_trainer.variables import device_of, format_bytes

#: A device holding less than this fraction of its fair share of bytes is worth a warning.
UNDERUSED_SHARE = 0.5


class Placement(PlacementReport):
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
                defer_to_device(v, lambda: placement.scope_device(node))

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
                    move_variable(v, device)
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
