"""Private TF checkpoint APIs: objects saved as one tensor in slices, renamed children, names in a checkpoint.

A sharded table is saved as one logical tensor (so a restore may re-slice it), which needs
TF's saveable API; a SavedModel export of a Keras model goes through its `ExportArchive`;
warm start reads the variable names a checkpoint holds. None has a public equivalent.
"""

from __future__ import annotations

import functools
from typing import Any

from tfdist_trainer.tf_compat.keras_variables import variable_storage


def trackable_base() -> type:
    """`tf.__internal__.tracking.Trackable`: the base of every object a `tf.train.Checkpoint` can hold.

    A sharded table is saved as one logical tensor, so its checkpoint child is
    not a variable but an object that supplies its own saveables
    (`_gather_saveables_for_checkpoint`). Only a Trackable may do that; TF has
    no public base class for it (`tf.Module` is one, but brings variable
    tracking that would save the shards a second time).
    """
    import tensorflow as tf

    return tf.__internal__.tracking.Trackable


def saveable_classes() -> tuple[type, type]:
    """(SaveableObject, SaveSpec) from `tensorflow.python.training.saving.saveable_object`.

    The checkpoint API that TF's own `ShardedVariable` uses to save slices of
    one tensor from several variables (each slice a SaveSpec with its
    `SaveSliceInfo` spec), so that a restore may ask for any other slicing.
    TF exports no public way to save one tensor as slices held by several
    variables (`tf.train.experimental.PythonState` saves one string).
    """
    from tensorflow.python.training.saving import saveable_object

    return saveable_object.SaveableObject, saveable_object.SaveSpec


@functools.cache
def sliced_tensor_trackable() -> type:
    """A Trackable base class whose instances a `tf.train.Checkpoint` saves as one tensor, in slices.

    A subclass sets `checkpoint_key` (the saveable's name under the object)
    and `checkpoint_dtype`, and defines `checkpoint_slices()` ([(the slice's
    `SaveSliceInfo` spec, the device to read it on)], in save order),
    `read_slice(index)` (the slice's tensor) and `restore_slices(tensors)`
    (assigns the slices a restore read, in the same order; returns an op).
    Each save or restore sets `checkpoint_name`, the tensor's key in that
    checkpoint (what a reader of the file by key asks for).

    Reaches `Trackable._gather_saveables_for_checkpoint` and a
    `SaveableObject` of one `SaveSpec` per slice (`saveable_classes`), as TF's
    own `ShardedVariable` does: the only way to save one logical tensor from
    several variables so that a restore may ask for another slicing. TF has
    no public hook for an object to supply its own saved tensors.
    """
    trackable = trackable_base()
    saveable_object, save_spec = saveable_classes()

    class SlicedTensorSaveable(saveable_object):
        def __init__(self, owner, name: str):
            self._owner = owner
            owner.checkpoint_name = name
            specs = [
                save_spec(
                    (lambda index=index: owner.read_slice(index)),
                    spec,
                    name,
                    dtype=owner.checkpoint_dtype,
                    device=device,
                )
                for index, (spec, device) in enumerate(owner.checkpoint_slices())
            ]
            super().__init__(None, specs, name)

        def restore(self, restored_tensors, restored_shapes):
            del restored_shapes
            return self._owner.restore_slices(restored_tensors)

    class SlicedTensorTrackable(trackable):
        checkpoint_key = "tensor"
        checkpoint_dtype: Any = None
        #: The tensor's full key in the last checkpoint saved or restored (set by the saveable).
        checkpoint_name: str | None = None

        def _gather_saveables_for_checkpoint(self):
            return {self.checkpoint_key: lambda name: SlicedTensorSaveable(self, name)}

    return SlicedTensorTrackable


class ReplacesCheckpointChildren:
    """Mixin for a Keras layer or optimizer: `checkpoint_children(children)` chooses what a checkpoint saves under it.

    Overrides `Trackable._trackable_children(save_type)`, the hook through
    which `tf.train.Checkpoint` asks an object for its children: the
    object's tracked attributes by name, passed to `checkpoint_children`,
    which returns the {name: Trackable} to save instead. A SavedModel export
    asks `saved_model_children` (default: the tracked attributes), e.g. for a
    resource the serving function uses that Keras does not track. TF has no
    public way for an object to change its children (`tf.Module` and Keras
    track every attribute).
    """

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "checkpoint":
            return self.checkpoint_children(children)
        return self.saved_model_children(children)

    def checkpoint_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return children

    def saved_model_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return children


def track_sublayers(owner: Any, layers: Any) -> None:
    """Makes each of `layers` a checkpoint child of the Keras layer `owner`, under the layer's name.

    Keras 3 keeps a list attribute of sublayers (``self.tables = [...]``) in its own
    `TrackedList`, which is not a TF Trackable: `tf.train.Checkpoint` then saves none of
    those sublayers' weights (Keras 3.15, TF 2.21; `model.save` finds them, a checkpoint
    does not). `Trackable._track_trackable` is the private hook `AutoTrackable` itself
    uses for an attribute; there is no public way to add a dependency.
    """
    for layer in layers:
        owner._track_trackable(layer, name=layer.name, overwrite=True)  # noqa: SLF001


def export_archive_of(model: Any) -> Any:
    """A `keras.export.ExportArchive` serving `model`'s call as ``serve`` and as
    ``serving_default``, whose outputs are named after the model's (`named_outputs`); each weight
    saved once.

    `model.export(format="tf_saved_model")` builds the same archive, but its
    SavedModel holds every weight twice: once under ``variables/N`` (the
    archive's lists of the tracked layer's Keras variables, each a trackable
    of its own) and once under ``_all_variables/N`` (the TF variables the
    endpoint captures). Measured on Keras 3 / TF 2.21: 12.8 MB of variables
    for a 6.4 MB table; 8.0 GB for the 4.0 GB click model. The lists here hold
    the TF variables themselves, which the SavedModel then saves once (1.0x).
    Keras has no public switch for it; the input signature is the one
    `model.export` infers (`keras.src.export.export_utils`).
    """
    import keras
    from keras.src.export.export_utils import get_input_signature

    archive = keras.export.ExportArchive()
    signature = get_input_signature(model)
    # `serve` stays the model's call (a Python caller's `loaded.serve(x)` gets the model's own
    # outputs); TF Serving's `serving_default` returns them under the model's names.
    archive.track_and_add_endpoint("serve", model, signature)
    names = serving_output_names(model)

    def serving_default(*inputs):
        return named_outputs(model(*inputs), names)

    archive.add_endpoint("serving_default", serving_default, signature)
    tracked = archive._tf_trackable  # noqa: SLF001
    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        setattr(tracked, name, [variable_storage(v) for v in getattr(tracked, name)])
    return archive


def serving_output_names(model: Any) -> list[str]:
    """The names a functional model gives its outputs (its output layers' names), or [] where it
    gives none (a subclassed model)."""
    names = list(getattr(model, "output_names", None) or [])
    return names if len(set(names)) == len(names) else []


def named_outputs(outputs: Any, names: list[str]) -> Any:
    """A serving signature's outputs under names a client can read: a dict keeps its keys; a
    tensor, or a list of them, takes the model's output names (`serving_output_names`), else
    ``output_0``, ``output_1``... as Keras' own `model.export` names them."""
    if isinstance(outputs, dict):
        return outputs
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if len(names) != len(flat):
        names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(names, flat))


def checkpoint_variable_names(prefix: str, child: str | None = None) -> dict[str, str]:
    """{checkpoint key: the variable's name when it was saved} for the variables of a TF2 checkpoint.

    With `child`, only the variables reachable from that child of the saved
    root (``model`` in the Checkpointer's layout) without passing through
    another child of the root: not the optimizer's slots, even when a
    compiled model holds the optimizer.

    A `tf.train.Checkpoint` names a value by its first place in the object
    graph (``model/_functional/_operations/1/_kernel/...``, or even
    ``optimizer/_trainable_variables/0/...``), which changes with the model's
    structure; the variable's own name (for Keras 3, its `.path`,
    ``sequential/dense/kernel``) and the graph's edges are kept only in the
    serialized `TrackableObjectGraph` proto under the reader's
    ``_CHECKPOINTABLE_OBJECT_GRAPH`` key. `tf.train.list_variables` returns keys
    and shapes only, so there is no public way to read them; warm start matches
    variables by these names.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    if child is None:
        reachable = set(range(len(graph.nodes)))
    else:
        roots = [c.node_id for c in graph.nodes[0].children if c.local_name == child]
        # Not through the root's other children: a compiled Keras model tracks its optimizer,
        # which is also the root's `optimizer`; its slots are not the model's variables.
        others = {c.node_id for c in graph.nodes[0].children if c.local_name != child}
        reachable, stack = set(roots), list(roots)
        while stack:
            for c in graph.nodes[stack.pop()].children:
                if c.node_id not in reachable and c.node_id not in others:
                    reachable.add(c.node_id)
                    stack.append(c.node_id)
    return {
        attribute.checkpoint_key: attribute.full_name.removesuffix(":0")
        for node_id in sorted(reachable)
        for attribute in graph.nodes[node_id].attributes
        if attribute.name == "VARIABLE_VALUE"
    }
