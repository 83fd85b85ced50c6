"""A background save's copies: the small state, copied at the step; the tables only recorded.

An asynchronous save must write the state of its step while training changes
it. `Snapshot.take()` copies, at the step, every tensor the checkpoint saves
except the tables' (the step counter, dense weights and their optimizer
slots, optimizer scalars: small) into a copy variable on
the CPU of the task that holds it (a GPU's tensors in its host's memory), by
one traced function. The checkpoint is then told to save the copies in place
of the originals (`tf_compat.save_stand_ins`), under the originals' names, so
a restore cannot tell.

The tables (sharded tables and their optimizer slots, dynamic tables) are not
copied at the step: a copy of them would double the memory of the tasks that
hold them (1B recipe: 4.5 GB a ps instead of 2.6-2.8) for the task's life.
Their stand-ins only record their keys; the write reads and writes them a part
at a time (`table_parts`), so a task holds at most one part (a "div" shard, a
64 MiB "mod" chunk, a dynamic table's export) besides its tables. What that
means for a checkpoint's step is in `Checkpointer.save`.

What it costs: the small state's copies, kept for the task's life so that each
save does not allocate them again; `take()` copies only them (a memory copy,
not a write to storage).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.runtime.checkpoints import table_parts
from tfdist_trainer.runtime.checkpoints.table_parts import Part


class Snapshot:
    """Copy variables for the small state `checkpoint` saves (`take()` refreshes them all at
    once), and the parts the write reads its tables in (`parts`)."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        """Makes the copies (filled with the state as it is now) and installs the stand-ins: from
        here on every save of `checkpoint` writes the copies, and records the tables without
        writing them (`write_parts` writes them into the same checkpoint)."""
        self._pairs: list[tuple[Any, str, str | None, tf.Variable]] = []
        #: The tables' parts, in the order a synchronous save writes them.
        self.parts: list[Part] = []
        stand_ins = tf_compat.identity_dict()
        given_tensors = tf_compat.tensors_trackable()
        names = tf_compat.object_names(checkpoint)
        for trackable in tf.train.TrackableView(checkpoint).descendants():
            if trackable is checkpoint:
                continue
            saved = tf_compat.saved_tensors(trackable)
            if not saved:
                continue
            if table_parts.written_apart(trackable):
                self.parts += table_parts.parts_of(trackable, names[trackable], saved)
                reads = self._recorded_only(saved)
            else:
                reads = {
                    key: (
                        {
                            spec: self._copy(trackable, key, spec, part)
                            for spec, part in value.items()
                        }
                        if isinstance(value, dict)
                        else self._copy(trackable, key, None, value)
                    )
                    for key, value in saved.items()
                }
            stand_ins[trackable] = given_tensors(reads, tf_compat.saved_full_name(trackable))
        tf_compat.save_stand_ins(checkpoint, stand_ins)
        self._here = tf.constant(0).device  # this task's CPU, where `take` waits for the copies
        # Traced now, at start-up: the first save would otherwise hold training for the trace.
        # Kept as the concrete function: a tf.function called from another thread (the stall
        # save's) traces again, since the strategy scope is per thread, and a new function is
        # registered on every task of the cluster, which hangs when a worker is silent.
        self._refresh = tf.function(self._assign_all, autograph=False).get_concrete_function()

    def take(self) -> None:
        """Copies the small state as it is now; returns once every copy is done (training may go
        on). The tables are read by the write (`write_parts`).

        Waits for the copies' answer: a function whose ops all run on other tasks (a ps's
        copies) is only dispatched by the call, and a worker's next step could then update
        the state before it is copied."""
        self._refresh().numpy()

    def write_parts(self, prefix: tf.Tensor) -> tuple[list[Any], list[tf.Tensor]]:
        """Inside the traced write: the tables, a part at a time per task, into files
        ``<prefix>-<n>`` (`table_parts.write_parts`); (the writes, the files' prefixes)."""
        return table_parts.write_parts(self.parts, prefix)

    def _copy(self, trackable: Any, key: str, spec: str | None, value: Any) -> Any:
        """A copy variable of one saved tensor, on its device; returns how a save reads it."""
        tensor, device = tf_compat.saved_value(value)
        with tf.device(table_parts.host_of(device)):
            copy = tf.Variable(
                tf.identity(tensor), shape=tf.TensorShape(None), trainable=False, name="snapshot"
            )
        self._pairs.append((trackable, key, spec, copy))

        def read() -> tf.Tensor:
            with tf.device(copy.device):
                return copy.read_value()

        return read

    def _recorded_only(self, saved: dict[str, Any]) -> dict[str, Any]:
        """A stand-in's reads for a table: each of its keys and slices recorded in the
        checkpoint's object graph, none written (`tf_compat.recorded_not_written`). Recorded on
        the device of the small state's first copy: TF's save writes a file per device it is
        given, and one for the tables' device would hold nothing."""

        def record(value: Any) -> Any:
            dtype, device = tf_compat.saved_dtype_and_device(value)
            return lambda: tf_compat.recorded_not_written(
                dtype, self._pairs[0][3].device if self._pairs else device
            )

        return {
            key: (
                {spec: record(part) for spec, part in value.items()}
                if isinstance(value, dict)
                else record(value)
            )
            for key, value in saved.items()
        }

    def _assign_all(self) -> tf.Tensor:
        """Copies every small tensor; returns a tensor of this task's that is computed once they
        all are (`take` waits for it)."""
        saved = {}
        copied = []
        for trackable, key, spec, copy in self._pairs:
            if id(trackable) not in saved:
                saved[id(trackable)] = tf_compat.saved_tensors(trackable)
            value = saved[id(trackable)][key]
            tensor, _ = tf_compat.saved_value(value[spec] if spec is not None else value)
            with tf.device(copy.device):
                copied.append(copy.assign(tensor, read_value=False))
        with tf.device(self._here), tf.control_dependencies(copied):
            return tf.constant(True)
