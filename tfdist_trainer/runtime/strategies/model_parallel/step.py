"""The model-parallel training step: forward over the placed layers (per micro-batch), backward, one update.

The step differentiates with ``tf.gradients``, which colocates each gradient op
with its forward op: on TF 2.21 a ``GradientTape`` leaves every backward op on
the default device whatever the forward placement. Placement is by the layers'
own scopes (`placement.Placement`), at any depth, so a stage may be a block
nested deep inside a backbone.

With ``num_micro_batches = M > 1`` the replica batch is split into M micro-batches
whose forward passes (and then backward passes) are independent branches of one
graph (GPipe's schedule: every forward, then every backward; gradients summed over
micro-batches, applied once). TF's executor runs ready ops of different devices
concurrently, so stage k of micro-batch m overlaps stage k+1 of m-1. The loss and
its gradients are the unpipelined ones for layers that treat examples
independently; BatchNormalization normalises each micro-batch with its own
statistics (as in GPipe), so a model with it trains differently when pipelined:
`make_train_step` says so once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.runtime.strategies.model_parallel.devices import on_device
from tfdist_trainer.variables import device_of


def split_batch(structure: Any, num: int) -> list[Any]:
    """Splits every tensor of a (nested) batch into `num` micro-batches along axis 0 (sizes differ by <= 1)."""
    import tensorflow as tf

    leaves = tf.nest.flatten(structure)
    parts = []
    for leaf in leaves:
        leaf = tf.convert_to_tensor(leaf)
        n = leaf.shape[0] if leaf.shape.rank else None
        if n is not None:
            sizes = [n // num + (1 if m < n % num else 0) for m in range(num)]
            parts.append(tf.split(leaf, sizes, axis=0))
        else:
            n = tf.shape(leaf, out_type=tf.int32)[0]
            sizes = n // num + tf.cast(tf.range(num) < n % num, tf.int32)
            parts.append(tf.split(leaf, sizes, num=num, axis=0))
    return [tf.nest.pack_sequence_as(structure, [p[m] for p in parts]) for m in range(num)]


def compute_gradients(
    trainer: Any, batch: Any, *, num_micro_batches: int = 1, loss_device: str | None = None
) -> tuple[Any, list, list]:
    """(loss, gradients of trainer.model.trainable_variables, [(labels, predictions, sample_weight) per micro-batch]).

    The loss is ``trainer.average_loss`` of the per-example losses of the whole
    replica batch (concatenated over micro-batches), so it and its gradients are
    the unpipelined ones whatever `num_micro_batches` is. A compiled model's
    loss (`Trainer.step_loss`, a mean per micro-batch) is weighted by each
    micro-batch's share of the examples, to the same end. Inside a graph the
    gradients come from ``tf.gradients`` (colocated with their forward ops); in
    eager mode from a GradientTape.
    """
    import keras
    import tensorflow as tf

    from tfdist_trainer.trainers import compiled

    features, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    variables = trainer.model.trainable_variables
    compiled_loss = compiled.uses_compiled_loss(trainer)

    def forward():
        if num_micro_batches == 1:
            parts = [(features, labels, sample_weight)]
        else:
            weights = (
                [None] * num_micro_batches
                if sample_weight is None
                else split_batch(sample_weight, num_micro_batches)
            )
            parts = list(
                zip(
                    split_batch(features, num_micro_batches),
                    split_batch(labels, num_micro_batches),
                    weights,
                )
            )
        outputs, per_example, shares = [], [], []
        for part_features, part_labels, part_weight in parts:
            predictions = trainer.model(part_features, training=True)
            with on_device(loss_device):
                if compiled_loss:
                    share = trainer.step_loss(part_features, part_labels, predictions, part_weight)
                    examples = tf.shape(tf.nest.flatten(part_features)[0])[0]
                    shares.append((share, tf.cast(examples, tf.float32)))
                else:
                    losses = tf.convert_to_tensor(trainer.compute_loss(part_labels, predictions))
                    if losses.shape.rank not in (None, 1):
                        trainer.average_loss(losses)  # raises its one-line error about the shape
                    if part_weight is not None:
                        losses *= tf.cast(part_weight, losses.dtype)
                    per_example.append(losses)
            outputs.append((part_labels, predictions, part_weight))
        with on_device(loss_device):
            if compiled_loss:
                total = tf.add_n([n for _, n in shares])
                loss = tf.add_n([share * n / total for share, n in shares])
            else:
                all_losses = (
                    per_example[0] if len(per_example) == 1 else tf.concat(per_example, axis=0)
                )
                loss = trainer.average_loss(all_losses)
            scaled = trainer.optimizer.scale_loss(loss) if trainer.optimizer is not None else loss
        return loss, scaled, outputs

    if tf.executing_eagerly():
        with tf.GradientTape() as tape:
            loss, scaled, outputs = forward()
        gradients = tape.gradient(scaled, variables)
    else:
        loss, scaled, outputs = forward()
        gradients = [
            _on_variable_device(g, v) for g, v in zip(tf.gradients(scaled, variables), variables)
        ]
    return loss, list(gradients), outputs


def _on_variable_device(gradient: Any, variable: Any) -> Any:
    """A gradient with no device goes to its variable's device.

    ``tf.gradients`` colocates every gradient op with its forward op, except the sum
    of a variable's gradients from uses on several devices (a tied embedding used
    as the language-model head): that sum has no device, and a cross-replica
    reduce of it (model_parallel.data_parallel) fails with "destinations can not
    be empty". The variable's device is where the update happens anyway.
    """
    import tensorflow as tf

    if gradient is None or gradient.device:
        return gradient
    device = device_of(variable)
    if not device or device.startswith("mirrored:"):
        return gradient
    with tf.device(device):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(gradient.values), tf.identity(gradient.indices), gradient.dense_shape
            )
        return tf.identity(gradient)


def batch_norm_layers(model: Any) -> list[str]:
    """Paths of the model's BatchNormalization layers (each micro-batch gets its own statistics)."""
    import keras

    from tfdist_trainer import tf_compat

    return [
        layer.name
        for layer in tf_compat.sublayers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def warn_pipelined_batch_norm(trainer: Any, num_micro_batches: int) -> None:
    """Says once that pipelined BatchNormalization normalises each micro-batch on its own."""
    found = batch_norm_layers(trainer.model) if num_micro_batches > 1 else []
    if found:
        from absl import logging

        logging.warning(
            "model_parallel.num_micro_batches=%d with %d BatchNormalization layer(s) (%s%s): each "
            "micro-batch is normalised with its own statistics (as in GPipe), so the model trains "
            "differently than unpipelined; set model_parallel.num_micro_batches = 1 to keep "
            "whole-batch statistics.",
            num_micro_batches,
            len(found),
            ", ".join(found[:3]),
            ", ..." if len(found) > 3 else "",
        )


def make_train_step(
    trainer: Any,
    *,
    num_micro_batches: int,
    loss_device: str | None,
    log: Callable[[str], None] | None = None,
) -> Callable:
    """The per-replica step: forward over the placed layers (per micro-batch), backward, one update."""
    warn_pipelined_batch_norm(trainer, num_micro_batches)
    if trainer.overrides("train_step"):
        name = type(trainer).__name__
        if num_micro_batches > 1:
            raise ConfigError(
                f"model_parallel.num_micro_batches={num_micro_batches} replaces Trainer.train_step, "
                f"but {name} overrides train_step; set model_parallel.num_micro_batches = 1 or "
                f"drop the override."
            )
        if log:
            log(
                f"{name} overrides train_step: model_parallel runs it as it is; a GradientTape places "
                f"backward ops on the default device (use tf.gradients to colocate them with the forward ops)"
            )
        return trainer.train_step

    gradients_of = make_gradients_fn(
        trainer, num_micro_batches=num_micro_batches, loss_device=loss_device
    )

    def train_step(batch):
        loss, gradients = gradients_of(batch)
        trainer.apply_gradients(gradients)
        return loss

    return train_step


def make_gradients_fn(
    trainer: Any, *, num_micro_batches: int, loss_device: str | None
) -> Callable[[Any], tuple[Any, list]]:
    """batch -> (loss, gradients) over the placed layers, train metrics updated: what
    `train.gradient_accumulation_steps` calls once per batch (each pipelined over micro-batches)."""

    def gradients_of(batch):
        loss, gradients, outputs = compute_gradients(
            trainer, batch, num_micro_batches=num_micro_batches, loss_device=loss_device
        )
        for labels, predictions, sample_weight in outputs:
            trainer.update_metrics(trainer.train_metrics, labels, predictions, sample_weight)
        return loss, gradients

    return gradients_of
