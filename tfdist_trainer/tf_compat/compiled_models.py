"""Private Keras APIs of a compiled model: its loss and metrics, called outside `fit`.

`KerasTrainer` runs a model the user compiled inside the trainer's own loop, so it calls
the loss and metrics `compile` built, which Keras 3 keeps private.
"""

from __future__ import annotations

from typing import Any


def compiled_loss(model: Any) -> Any:
    """The `CompileLoss` that `model.compile(loss=...)` made (`Trainer._compile_loss`); None without one.

    Keras 3 computes a compiled model's loss through its public
    `model.compute_loss(...)`, but has no public way to ask whether `compile()`
    was given a loss, nor to create the loss's own state (one `Mean` per output
    of a multi-output model) before the first step: Keras builds it lazily,
    inside the first step, which under a distribution strategy must not
    create variables.
    """
    return getattr(model, "_compile_loss", None)


def build_compiled_loss(model: Any, y_true: Any, y_pred: Any) -> None:
    """Builds the compiled loss for labels and predictions shaped like `y_true`, `y_pred` (`CompileLoss.build`).

    Call it under the strategy's scope: the per-output loss trackers it creates
    are variables. A no-op when the model has no compiled loss or it is built.
    """
    loss = compiled_loss(model)
    if loss is not None and not loss.built:
        loss.build(y_true, y_pred)


def compiled_metrics(model: Any, y_true: Any, y_pred: Any) -> Any:
    """A new, built copy of the metrics given to `model.compile(metrics=..., weighted_metrics=...)`; None without any.

    Keras keeps them in one private `CompileMetrics` (`Trainer._compile_metrics`,
    its `_user_metrics` / `_user_weighted_metrics` as the user passed them) and
    resolves names such as "accuracy" against the labels and outputs when it
    builds it (`keras.src.trainers.compile_utils.CompileMetrics.build`). A
    training loop needs two independent sets (train and eval), and none of this
    is public. Metric objects the user passed are cloned from their config, so
    neither copy shares state with the other or with the model. The copy is a
    `keras.metrics.Metric` whose `result()` is a dict ({"accuracy": ...},
    {"out_a_accuracy": ...} per output); its variables are created here, so call
    it under the strategy's scope.
    """
    import keras
    from keras.src.trainers.compile_utils import CompileMetrics

    source = getattr(model, "_compile_metrics", None)
    if source is None:
        return None

    def clone(spec):
        if isinstance(spec, keras.metrics.Metric):
            return type(spec).from_config(spec.get_config())
        return spec

    def clone_all(specs):
        return None if specs is None else keras.tree.map_structure(clone, specs)

    copy = CompileMetrics(
        clone_all(source._user_metrics),  # noqa: SLF001
        clone_all(source._user_weighted_metrics),  # noqa: SLF001
        output_names=getattr(model, "output_names", None),
    )
    copy.build(y_true, y_pred)
    return copy
