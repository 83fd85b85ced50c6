"""A copy of everything a checkpoint saves, taken where it lives, for a background write.

An asynchronous save must write the state of one step while training changes
it. `Snapshot.take()` copies every tensor the checkpoint would save into a
copy variable on the CPU of the task that holds it (a GPU's tensors in its
host's memory): a parameter server's tables are copied on that ps, in its
memory, by one traced function (no byte crosses the network, nothing passes
through the chief). The checkpoint is then told to save the copies in place of
the originals (`tf_compat.save_stand_ins`), under the originals' names, so a
restore cannot tell.

What it costs: one more copy of the checkpointed state, in the memory of the
tasks that hold it (a ps holds its tables twice), kept for the task's life so
that each save does not allocate it again. `take()` costs a memory copy (a few
GB/s), not a write to storage.

Anything a checkpoint saves is copied the same way: variables, sharded tables
(one copy per slice), dynamic tables (their keys and rows as the save would
export them; the copy's shape follows theirs).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat


class Snapshot:
    """Copy variables for every tensor `checkpoint` saves; `take()` refreshes them all at once."""

    def __init__(self, checkpoint: tf.train.Checkpoint):
        """Makes the copies (filled with the state as it is now) and installs them as the
        checkpoint's stand-ins: from here on every save of `checkpoint` writes the copies."""
        self._pairs: list[tuple[Any, str, str | None, tf.Variable]] = []
        stand_ins = tf_compat.identity_dict()
        given_tensors = tf_compat.tensors_trackable()
        for trackable in tf.train.TrackableView(checkpoint).descendants():
            if trackable is checkpoint:
                continue
            saved = tf_compat.saved_tensors(trackable)
            if not saved:
                continue
            reads: dict[str, Any] = {}
            for key, value in saved.items():
                if isinstance(value, dict):
                    reads[key] = {
                        spec: self._copy(trackable, key, spec, part) for spec, part in value.items()
                    }
                else:
                    reads[key] = self._copy(trackable, key, None, value)
            stand_ins[trackable] = given_tensors(reads, tf_compat.saved_full_name(trackable))
        tf_compat.save_stand_ins(checkpoint, stand_ins)
        # Traced now, at start-up: the first save would otherwise hold training for the trace.
        # Kept as the concrete function: a tf.function called from another thread (the stall
        # save's) traces again, since the strategy scope is per thread, and a new function is
        # registered on every task of the cluster, which hangs when a worker is silent.
        self._refresh = tf.function(self._assign_all, autograph=False).get_concrete_function()

    def take(self) -> None:
        """Copies the state as it is now; returns once every copy is done (training may go on)."""
        self._refresh()

    def _copy(self, trackable: Any, key: str, spec: str | None, value: Any) -> Any:
        """A copy variable of one saved tensor, on its device; returns how a save reads it."""
        tensor, device = tf_compat.saved_value(value)
        with tf.device(_host_of(device)):
            copy = tf.Variable(
                tf.identity(tensor), shape=tf.TensorShape(None), trainable=False, name="snapshot"
            )
        self._pairs.append((trackable, key, spec, copy))

        def read() -> tf.Tensor:
            with tf.device(copy.device):
                return copy.read_value()

        return read

    def _assign_all(self) -> None:
        saved = {}
        for trackable, key, spec, copy in self._pairs:
            if id(trackable) not in saved:
                saved[id(trackable)] = tf_compat.saved_tensors(trackable)
            value = saved[id(trackable)][key]
            tensor, _ = tf_compat.saved_value(value[spec] if spec is not None else value)
            with tf.device(copy.device):
                copy.assign(tensor)


def _host_of(device: str | None) -> str | None:
    """The CPU of the task that holds `device`: a copy of a GPU's tensors goes to its host's
    memory (the GPU's is the scarce one), a ps's stays on that ps."""
    if not device:
        return None
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()
