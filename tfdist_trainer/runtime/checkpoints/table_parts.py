"""A background save's tables, written a slice at a time: each slice copied, written and let go
before the next, on each task that holds tables.

Why not copy the tables at the step, as the rest of the state is (`snapshot`):
the copies are as large as the tables, and a parameter server's memory bounds
the tables a user can train (1B recipe: 4.5 GB a ps with the copies, 2.6-2.8
without). Why not hand every slice to one SaveV2, as TF's own save does: a
SaveV2 reads all its inputs before it writes any, so a ps would hold all its
slices at once, and a reference to a table's buffer held while training
updates it makes the update copy the whole buffer (copy-on-write).

So each part (a table's saved slice: a "div" shard or a "mod" chunk, an
optimizer slot's slice; a dynamic table's export) is copied by a read of its
own and written by a SaveV2 of its own into a file of the checkpoint being
written, and the next part of the same task is read only once that write is
done (a control dependency): a task holds at most one part besides its tables.
Tasks write their parts at the same time. The files are merged into the
checkpoint with the rest of the state (`BackgroundWriter`), under the keys and
slices a synchronous save gives them, so a restore cannot tell.

What a part holds: the rows as they were when it was read, after the save's
step and before its write ended: every update of steps up to the save's step,
and possibly some of the steps training ran since (`Checkpointer.save`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding import runtime_api as tables

#: (checkpoint key, slice spec or "", tensor): one tensor a part writes.
Entry = tuple[str, str, tf.Tensor]


@dataclass(frozen=True)
class Part:
    """Tensors written together by one SaveV2: `read()` makes them (a copy, on `device`)."""

    device: str | None
    read: Callable[[], list[Entry]]


def written_apart(trackable: Any) -> bool:
    """Whether a background save writes `trackable` a part at a time rather than copying it at
    the step: a sharded table (or an optimizer slot's table), or a dynamic table."""
    return tables.is_table_checkpoint(trackable)


def parts_of(trackable: Any, object_name: str, saved: dict[str, Any]) -> list[Part]:
    """The parts of a `written_apart` object, whose `saved_tensors` are `saved`, named in the
    checkpoint `object_name`: one per saved slice of a table; one for a dynamic table (its keys
    and rows, exported by shard, each shard in its critical section)."""
    if tables.is_fixed_table_checkpoint(trackable):
        ((local, slices),) = saved.items()
        key = tf_compat.checkpoint_key(object_name, local)
        return [  # in save order: `copy_slice(index)` is the slice `spec` names
            Part(
                tf_compat.saved_dtype_and_device(value)[1],
                lambda index=index, spec=spec: [(key, spec, trackable.copy_slice(index))],
            )
            for index, (spec, value) in enumerate(slices.items())
        ]

    def export() -> list[Entry]:
        return [
            (tf_compat.checkpoint_key(object_name, local), "", tf_compat.saved_value(value)[0])
            for local, value in tf_compat.saved_tensors(trackable).items()
        ]

    devices = [tf_compat.saved_dtype_and_device(v)[1] for v in saved.values()]
    return [Part(devices[0], export)]


def write_parts(parts: list[Part], prefix: tf.Tensor) -> tuple[list[Any], list[tf.Tensor]]:
    """Inside the traced write: the SaveV2 of each part, into ``<prefix>-<n>``, one after the
    other on each task (a part is read once the task's previous part is written), the tasks
    side by side. Returns (the writes, the files' prefixes), for the merge."""
    last_on: dict[str | None, Any] = {}
    writes, prefixes = [], []
    for n, part in enumerate(parts):
        host = host_of(part.device)
        previous = last_on.get(host)
        with tf.control_dependencies([] if previous is None else [previous]):
            with tf.device(part.device):
                entries = part.read()
            with tf.device(host):
                file = tf.strings.join([prefix, f"-{n:05d}"])
                write = tf.raw_ops.SaveV2(
                    prefix=file,
                    tensor_names=[key for key, _, _ in entries],
                    shape_and_slices=[spec for _, spec, _ in entries],
                    tensors=[tensor for _, _, tensor in entries],
                )
        last_on[host] = write
        writes.append(write)
        prefixes.append(file)
    return writes, prefixes


def host_of(device: str | None) -> str | None:
    """The CPU of the task that holds `device`: a GPU's tensors are written (and copied) from its
    host's memory, a ps's stay on that ps."""
    if not device:
        return None
    return tf.DeviceSpec.from_string(device).replace(device_type="CPU", device_index=0).to_string()
