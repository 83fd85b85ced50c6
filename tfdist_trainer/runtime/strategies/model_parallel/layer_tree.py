"""A model seen as a tree of layers, each layer once, ordered by the calls of a forward pass.

What the placement plans over: Keras' tracked sublayers at any depth (a keras-hub backbone's
blocks sit two levels down), each at the first path Keras' tracking reaches it by, with every
other path kept as an alias (a tied layer, such as a token embedding reused as the LM head,
is reached twice but placed once). Each variable belongs to the deepest layer holding it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

from tfdist_trainer import tf_compat
from tfdist_trainer.plan.model_parallel_plan import Rule
from tfdist_trainer.variables import stored_bytes


def _children(layer: Any) -> list:
    import keras

    return [
        c
        for c in tf_compat.sublayers(layer, recursive=False)
        if not isinstance(c, keras.layers.InputLayer)
    ]


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
