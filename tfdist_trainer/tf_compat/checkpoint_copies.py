"""Private TF checkpoint APIs for a background save: what an object saves, and saving copies instead.

An asynchronous checkpoint copies every tensor a save would write (on the
device that holds it), lets training go on, and writes the copies from another
thread. That needs three things TF only has privately: the tensors an object
saves (`Trackable._serialize_to_tensors`, or the SaveableObjects of an older
object such as a sharded table), an object that saves given tensors under the
original's names, and a way to make `tf.train.Checkpoint` save such stand-ins
in place of the originals (the object map TF's own async checkpoint sets). TF's
own async checkpoint (`CheckpointOptions(enable_async=True)`) cannot be used
as it is: Keras 3 variables make their copy with a `tf.Variable(...)` on the
saving thread's device (the chief's memory under parameter_server), created
once inside a traced function, so later saves would write stale values.

A background save writes a table a slice at a time, each slice by a SaveV2 op of
its own into the same checkpoint: that needs each saved tensor's checkpoint key
before TF names it (`object_names`, `checkpoint_key`) and a stand-in value that
TF records in the object graph without writing it (`recorded_not_written`).
"""

from __future__ import annotations

import functools
from typing import Any


def saved_tensors(trackable: Any) -> dict[str, Any]:
    """{local name: value or {slice spec: value}}: what a checkpoint saves for `trackable` alone.

    A value is a tensor, a variable, or a `SaveSpec` (`saved_value` reads it).
    Objects of TF's current protocol answer `_serialize_to_tensors`; older ones
    (sharded tables, `sliced_tensor_trackable`) give SaveableObjects, whose
    specs are named by the local names a checkpoint gives them. An object with
    no tensors of its own (a layer, a list) gives {}.
    """
    from tensorflow.python.training.saving import saveable_object_util

    if saveable_object_util.trackable_has_serialize_to_tensor(trackable):
        return dict(trackable._serialize_to_tensors())  # noqa: SLF001
    saved: dict[str, Any] = {}
    for name, factory in trackable._gather_saveables_for_checkpoint().items():  # noqa: SLF001
        # A factory, or (older still) the variable itself (a ps-placed variable's wrapper).
        if callable(factory):
            saveables = [factory(name=name)]
        else:
            saveables = list(saveable_object_util.saveable_objects_for_op(factory, name))
        for spec in (spec for saveable in saveables for spec in saveable.specs):
            key = spec.name.decode() if isinstance(spec.name, bytes) else spec.name
            slice_spec = spec.slice_spec
            if isinstance(slice_spec, bytes):
                slice_spec = slice_spec.decode()
            if slice_spec:
                saved.setdefault(key, {})[slice_spec] = spec
            else:
                saved[key] = spec
    return saved


def saved_value(value: Any) -> tuple[Any, str | None]:
    """(tensor, device) of one value of `saved_tensors`: a `SaveSpec` is read (its tensor may be
    computed only when asked); the device is where a copy of it should live."""
    from tensorflow.python.training.saving import saveable_object

    if isinstance(value, saveable_object.SaveSpec):
        return value.tensor, value.device or None
    return value, getattr(value, "device", None) or None


@functools.cache
def tensors_trackable() -> type:
    """A Trackable class saving given tensors: ``cls(tensors, full_name)`` with {local name:
    callable or {slice spec: callable}}, each callable returning the tensor to write, and the
    name the checkpoint records for a variable (`saved_full_name` of the original).

    A checkpoint asks an object for its tensors through
    `Trackable._serialize_to_tensors`; TF has no public class that answers it
    with tensors it is given.
    """
    import tensorflow as tf

    class SavesGivenTensors(tf.__internal__.tracking.Trackable):
        def __init__(self, tensors: dict[str, Any], full_name: str = ""):
            self._tensors = tensors
            if full_name:
                # A checkpoint records a variable's own name beside its key (what warm start
                # matches by) only for an object that acts as a resource variable.
                self._should_act_as_resource_variable = True
                self._shared_name = full_name
                self._save_slice_info = None

        def _serialize_to_tensors(self):
            return {
                key: (
                    {spec: read() for spec, read in value.items()}
                    if isinstance(value, dict)
                    else value()
                )
                for key, value in self._tensors.items()
            }

    return SavesGivenTensors


def saved_full_name(trackable: Any) -> str:
    """The variable's own name a checkpoint records beside `trackable`'s key ("" for an object
    that is not a variable): TF's `checkpoint.util.get_full_name`, which has no public form."""
    from tensorflow.python.checkpoint import util

    return util.get_full_name(trackable)


def save_stand_ins(checkpoint: Any, stand_ins: dict[Any, Any]) -> None:
    """Makes every later save of `checkpoint` write ``stand_ins[obj]``'s tensors in place of obj's.

    The object graph, names and keys stay the originals', so a restore cannot
    tell. `stand_ins` is an `ObjectIdentityDictionary` (`identity_dict`). This
    sets the object map of the checkpoint's saver, the hook TF's own
    `AsyncCheckpointHelper` uses; there is no public one.
    """
    checkpoint._saver._object_map = stand_ins  # noqa: SLF001


def identity_dict() -> Any:
    """An `ObjectIdentityDictionary`: keys compared by identity (variables define ``==``)."""
    from tensorflow.python.util import object_identity

    return object_identity.ObjectIdentityDictionary()


def saved_dtype_and_device(value: Any) -> tuple[Any, str | None]:
    """(dtype, device) of one value of `saved_tensors`, without reading it: a `SaveSpec`'s tensor
    may be a read of a whole table slice, computed only when asked (`saved_value`)."""
    from tensorflow.python.training.saving import saveable_object

    if isinstance(value, saveable_object.SaveSpec):
        return value.dtype, value.device or None
    return value.dtype, getattr(value, "device", None) or None


def recorded_not_written(dtype: Any, device: str | None) -> Any:
    """A value for a stand-in's `_serialize_to_tensors`: the checkpoint records its key in the
    object graph (a restore finds it), but writes no tensor for it; another op writes that key
    into the same checkpoint (a table's slices, one SaveV2 each).

    TF's `MultiDeviceSaver` skips a `SaveSpec` whose tensor is None ("recorded in the object
    graph, but no value is saved"); a SaveSpec of a callable needs its dtype and device. There
    is no public way to record a tensor that another op writes.
    """
    from tensorflow.python.training.saving import saveable_object

    return saveable_object.SaveSpec(lambda: None, "", "", dtype=dtype, device=device or "CPU:0")


def object_names(checkpoint: Any) -> Any:
    """{trackable: the name a save of `checkpoint` gives it (``model/layer_with_weights-0/...``)},
    an `ObjectIdentityDictionary`: the first half of each of its tensors' keys.

    TF names the objects by their first path from the root, breadth first, as
    `save_util._gather_trackable_data` does at every save; the names are not
    public before a save has written them.
    """
    from tensorflow.python.checkpoint import graph_view
    from tensorflow.python.trackable import trackable_utils
    from tensorflow.python.util import object_identity

    _, paths = graph_view.ObjectGraphView(checkpoint).breadth_first_traversal()
    names = object_identity.ObjectIdentityDictionary()
    for trackable, path in paths.items():
        names[trackable] = trackable_utils.object_path_to_string(path)
    return names


def checkpoint_key(object_name: str, local_name: str) -> str:
    """The key a checkpoint saves the tensor `local_name` of the object `object_name` under
    (``<object name>/.ATTRIBUTES/<local name, escaped>``): `trackable_utils.checkpoint_key`."""
    from tensorflow.python.trackable import trackable_utils

    return trackable_utils.checkpoint_key(
        object_name, trackable_utils.escape_local_name(local_name)
    )
