"""tfdist_trainer.runtime.apply_warm_start.relative_names, in process. Warm starts in real runs are in tests/test_warm_start.py."""

from __future__ import annotations

from test_hooks_cli import project as project  # noqa: PLC0414  (the module fixture, shared)

from tfdist_trainer.runtime.apply_warm_start import relative_names


def test_relative_names():
    assert relative_names(["sequential_3/dense/kernel", "sequential_3/head/bias"]) == [
        "dense/kernel",
        "head/bias",
    ]
    assert relative_names(["a/kernel", "b/kernel"]) == ["a/kernel", "b/kernel"]
    # A variable outside the model's scope keeps its whole name; the model's lose the prefix.
    assert relative_names(["m/dense/kernel", "m/dense/bias", "total"]) == [
        "dense/kernel",
        "dense/bias",
        "total",
    ]
    assert relative_names(["kernel"]) == ["kernel"]
