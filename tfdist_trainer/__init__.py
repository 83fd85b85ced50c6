"""tfdist_trainer: train Keras 3 models on a TensorFlow cluster with one Trainer subclass.

Public names are loaded lazily so that `tfdist-train` can validate a cluster
description before paying for (and being confused by) a TensorFlow import.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "Trainer": ("tfdist_trainer.trainers.trainer", "Trainer"),
    "Experiment": ("tfdist_trainer.plan.experiment", "Experiment"),
    "shard": ("tfdist_trainer.trainers.data", "shard"),
    "KerasTrainer": ("tfdist_trainer.trainers.keras_trainer", "KerasTrainer"),
    "train": ("tfdist_trainer.api", "train"),
    "evaluate": ("tfdist_trainer.api", "evaluate"),
    "export": ("tfdist_trainer.api", "export"),
    "load_model": ("tfdist_trainer.api", "load_model"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'tfdist_trainer' has no attribute {name!r}")
