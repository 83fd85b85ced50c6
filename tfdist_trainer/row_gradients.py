"""Gradients taken at the rows a step looked up, not at the tables they came from.

Under parameter_server a table's rows live on the ps tasks. Differentiated at the
table variables, every gather of every shard sends its own gradient (values and
indices) back from the worker: for the click model's 26 tables on 2 ps, about 160
transfers a step. A lookup that reads all the rows one ps holds in one tensor can
instead be differentiated at that tensor: one gradient transfer per ps, split
into each shard's `tf.IndexedSlices` on the ps itself (as TPU embeddings apply
theirs). `benchmarks/stacked_lookup.py` measures it (`group`): 1.35x steps/s, 36 -> 24 ms
of cluster CPU a step, the same loss.

Two sides meet here, neither knowing the other:

- the step that owns the `tf.GradientTape` (the Trainer's `compute_gradients`)
  opens `recording(tape)` around its forward pass and asks the recorder for the
  gradients (`RowGradients.gradient`), exactly where it would ask the tape;
- a lookup that can use it (`sharding.lookup_together`) reads its rows through
  `RowGradients.read`, with a function that turns the gradient at those rows into
  `(variable, IndexedSlices)` pairs.

Outside `recording` (evaluation, export, a user's own tape) `active()` is None and
lookups differentiate as any Keras layer does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

#: Turns the gradient at a read's rows into the gradients of the variables it read.
ToVariables = Callable[[tf.Tensor], Sequence[tuple[Any, tf.IndexedSlices]]]

_local = threading.local()  # MirroredStrategy traces each replica in a thread of its own


class RowGradients:
    """The rows read under one tape, and how their gradients become the variables'."""

    def __init__(self, tape: tf.GradientTape):
        self._tape = tape
        self._reads: list[tuple[tf.Tensor, ToVariables]] = []

    def read(self, read_rows: Callable[[], tf.Tensor], to_variables: ToVariables) -> tf.Tensor:
        """`read_rows()`, recorded so that the tape differentiates the rows, not the variables read.

        The read itself is not recorded (a recorded gather would also send each shard's
        gradient on its own): the tape watches its result instead.
        """
        with self._tape.stop_recording():
            rows = read_rows()
        self._tape.watch(rows)
        self._reads.append((rows, to_variables))
        return rows

    def gradient(self, target: tf.Tensor, variables: Sequence[Any]) -> list:
        """`tape.gradient(target, variables)`, with the gradients of the recorded reads added in."""
        variables = list(variables)
        rows = [r for r, _ in self._reads]
        gradients = self._tape.gradient(target, variables + rows)
        by_variable: dict[int, list] = {}
        for (_, to_variables), gradient in zip(self._reads, gradients[len(variables) :]):
            if gradient is None:  # the loss does not depend on these rows
                continue
            for variable, slices in to_variables(gradient):
                by_variable.setdefault(id(variable), []).append(slices)
        result = []
        for variable, gradient in zip(variables, gradients[: len(variables)]):
            for part in by_variable.get(id(variable), ()):
                gradient = add(gradient, part)
            result.append(gradient)
        return result


def active() -> RowGradients | None:
    """The recorder of the step being traced, or None outside `recording`."""
    return getattr(_local, "recorder", None)


@contextlib.contextmanager
def recording(tape: tf.GradientTape) -> Iterator[RowGradients]:
    """Lets lookups inside the block be differentiated at their rows (see the module docstring)."""
    outer = active()
    _local.recorder = RowGradients(tape)
    try:
        yield _local.recorder
    finally:
        _local.recorder = outer


def add(a: Any, b: Any) -> Any:
    """The sum of two gradients of one variable (IndexedSlices stay sparse: their rows concatenated)."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape
        )
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
