"""Warm start (`train.warm_start = @WarmStart()`) through the real `tfdist-train` command line.

A source run trains test_user_module's MLP (layers ``dense`` and ``dense_1``).
New runs warm-start from it with ``MyTrainer.learning_rate=0.0``: Adam then
leaves every weight where the run started, so the new run's checkpoint shows
exactly what warm start assigned. Weights are compared by restoring each
checkpoint into a model built in this process (`tf.train.Checkpoint`), not
through the code under test. Sources: a model_dir, a checkpoint prefix, and a
Keras ``.weights.h5``; strategies: one_device, and parameter_server (chief,
worker, ps: the variables live on the ps) through `tfdist-launch`.
"""

from __future__ import annotations

import json
import os
import re
import sys

import clusterlib
import keras
import numpy as np
import pytest
import tensorflow as tf
from clusterlib import launch_cmd
from test_hooks_cli import error_line, expect_exit, records, train, train_args, user_env
from test_hooks_cli import project as project  # noqa: PLC0414  (the module fixture, shared)

from tfdist_trainer import tf_compat
from tfdist_trainer.runtime.apply_warm_start import relative_names

TIMEOUT_S = 180
NAMES = ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]


def warm(checkpoint, regex: str | None = None) -> list[str]:
    bindings = ["train.warm_start=@WarmStart()", f"WarmStart.checkpoint='{checkpoint}'"]
    return bindings + ([f"WarmStart.vars_regex='{regex}'"] if regex is not None else [])


FROZEN = ["train.train_steps=10", "MyTrainer.learning_rate=0.0"]


def user_model(project):
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    import my_trainers

    return my_trainers.MyTrainer().build_model()


def weights(project, checkpoint: str) -> dict[str, np.ndarray]:
    """{name: value} of the model variables in `checkpoint` (a prefix or a model_dir)."""
    if os.path.isdir(checkpoint):
        checkpoint = tf.train.latest_checkpoint(checkpoint)
    model = user_model(project)
    tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
    # build order: dense/kernel, dense/bias, dense_1/kernel, dense_1/bias
    return dict(zip(NAMES, (v.numpy() for v in model.variables), strict=True))


def step_values(model_dir) -> dict[str, int]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {
        "global_step": int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")),
        "optimizer_iterations": int(
            reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
        ),
    }


def report(model_dir) -> dict:
    with open(os.path.join(model_dir, "warm_start.json")) as f:
        return json.load(f)


def assert_same(a: dict, b: dict, names) -> None:
    for name in names:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def assert_differ(a: dict, b: dict, names) -> None:
    for name in names:
        assert not np.array_equal(a[name], b[name]), f"{name} was warm-started"


@pytest.fixture(scope="module")
def source(project, tmp_path_factory):
    """A trained run (30 steps) to warm-start from."""
    model_dir = tmp_path_factory.mktemp("warm_source") / "model"
    expect_exit(train(project, model_dir, "train.train_steps=30"), 0)
    return model_dir


@pytest.fixture(scope="module")
def partial_run(project, source, tmp_path_factory):
    """Warm-starts the first layer only ('dense/' does not match 'dense_1/...')."""
    model_dir = tmp_path_factory.mktemp("warm_partial") / "model"
    return model_dir, train(project, model_dir, *FROZEN, *warm(source, "dense/"))


def test_warm_starts_the_matching_variables_only(project, source, partial_run):
    model_dir, result = partial_run
    out = expect_exit(result, 0)
    new, old = weights(project, str(model_dir)), weights(project, str(source))
    assert_same(new, old, ["dense/kernel", "dense/bias"])
    assert_differ(new, old, ["dense_1/kernel"])  # freshly initialised (the zero bias may match)
    assert report(model_dir) == {
        "from": str(source),
        "checkpoint": f"{source}/ckpt-30",
        "vars_regex": "dense/",
        "warm_started": ["dense/kernel", "dense/bias"],
        "fresh": ["dense_1/kernel", "dense_1/bias"],
    }
    assert (
        f"warm start from {source}/ckpt-30 (vars_regex 'dense/'): 2 of 4 variables warm-started"
        in out
    ), out[-4000:]
    for line in (
        "dense/kernel    [8, 16]  warm-started",
        "dense_1/kernel  [16, 1]  fresh (not matched by vars_regex)",
    ):
        assert line in out, out[-4000:]


def test_global_step_and_optimizer_start_fresh(partial_run):
    model_dir, result = partial_run
    out = expect_exit(result, 0)
    assert "restored" not in out
    assert [r["step"] for r in records(model_dir, "train")] == [10]
    assert step_values(model_dir) == {"global_step": 10, "optimizer_iterations": 10}


def test_a_model_dir_with_a_checkpoint_resumes_and_skips_warm_start(project, source, partial_run):
    model_dir, result = partial_run
    expect_exit(result, 0)
    before = weights(project, str(model_dir))
    out = expect_exit(
        train(
            project, model_dir, "train.train_steps=20", "MyTrainer.learning_rate=0.0", *warm(source)
        ),
        0,
    )
    assert f"restored {model_dir}/ckpt-10 (step 10)" in out, out[-4000:]
    assert (
        f"model_dir {model_dir} holds a checkpoint (step 10): resuming from it; warm start from "
        f"{source} skipped" in out
    ), out[-4000:]
    assert_same(weights(project, str(model_dir)), before, NAMES)  # not overwritten by the source
    assert step_values(model_dir)["global_step"] == 20
    assert report(model_dir)["vars_regex"] == "dense/"  # the first run's report stays


def test_warm_start_from_a_checkpoint_prefix(project, source, tmp_path):
    """Any checkpoint of the source, not only its latest; here the second layer only."""
    model_dir = tmp_path / "model"
    prefix = tf.train.latest_checkpoint(str(source))
    expect_exit(train(project, model_dir, *FROZEN, *warm(prefix, "dense_1/")), 0)
    new, old = weights(project, str(model_dir)), weights(project, prefix)
    assert_same(new, old, ["dense_1/kernel", "dense_1/bias"])
    assert_differ(new, old, ["dense/kernel", "dense/bias"])
    assert report(model_dir)["warm_started"] == ["dense_1/kernel", "dense_1/bias"]


def test_warm_start_from_keras_weights_h5(project, tmp_path):
    """model.save_weights() of the same architecture, e.g. from a model.fit run."""
    model = user_model(project)
    rng = np.random.default_rng(5)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    h5 = tmp_path / "pretrained.weights.h5"
    model.save_weights(str(h5))
    expected = dict(zip(NAMES, model.get_weights(), strict=True))
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, *FROZEN, *warm(h5)), 0)
    assert_same(weights(project, str(model_dir)), expected, NAMES)
    assert report(model_dir)["warm_started"] == NAMES
    assert f"warm start from {h5} (vars_regex '.*'): 4 of 4 variables warm-started" in out


# -- bad inputs: one sentence, exit 2, no checkpoint written -------------------------


@pytest.mark.parametrize(
    "make_bindings, message",
    [
        (
            lambda source, tmp: warm(source, "encoder/"),
            "WarmStart.vars_regex='encoder/' matches none of the model's variables (dense/kernel, "
            "dense/bias, dense_1/kernel, dense_1/bias); fix it (it is matched from the start of "
            "each name).",
        ),
        (
            lambda source, tmp: warm(tmp / "nothing_here"),
            "WarmStart.checkpoint='{tmp}/nothing_here' is not a model_dir, a checkpoint prefix or "
            "a Keras .weights.h5 file (",
        ),
        (
            lambda source, tmp: warm(tmp),
            "WarmStart.checkpoint='{tmp}' is a directory without a checkpoint; name a model_dir "
            "that holds one, or a checkpoint prefix.",
        ),
        (
            lambda source, tmp: warm(tmp / "missing.weights.h5"),
            "WarmStart.checkpoint='{tmp}/missing.weights.h5' does not exist; name a Keras "
            ".weights.h5 file, a model_dir or a checkpoint prefix.",
        ),
        (
            lambda source, tmp: warm(source, "dense/("),
            "WarmStart.vars_regex='dense/(' is not a regular expression (missing ), unterminated "
            "subpattern at position 6).",
        ),
        (
            lambda source, tmp: ["train.warm_start=@WarmStart()"],
            "WarmStart.checkpoint must name a model_dir, a checkpoint prefix or a Keras "
            ".weights.h5 file, got None.",
        ),
    ],
    ids=["regex_matches_nothing", "no_such_path", "empty_dir", "no_such_h5", "bad_regex", "unset"],
)
def test_bad_warm_start_is_one_sentence(project, source, tmp_path, make_bindings, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, *FROZEN, *make_bindings(source, empty)), 2)
    assert error_line(out).startswith(message.format(tmp=empty)), error_line(out)
    assert not os.path.exists(model_dir / "checkpoint")


def test_h5_of_another_architecture_is_one_sentence(project, tmp_path):
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    h5 = tmp_path / "other.weights.h5"
    other.save_weights(str(h5))
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, *FROZEN, *warm(h5)), 2)
    line = error_line(out)
    assert line.startswith(f"WarmStart.checkpoint='{h5}' does not fit the Trainer's model ("), line
    assert line.endswith(
        "a Keras .weights.h5 must come from the same architecture (use one of our checkpoints to "
        "warm-start part of a different model)."
    ), line
    assert not os.path.exists(model_dir / "checkpoint")


def test_a_shape_that_does_not_fit_is_one_sentence(project, source, tmp_path):
    """A wider first layer (hidden=32): its kernel cannot take the source's [8, 16]."""
    model_dir = tmp_path / "model"
    out = expect_exit(
        train(project, model_dir, *FROZEN, "MyTrainer.hidden=32", *warm(source, "dense/")), 2
    )
    assert error_line(out) == (
        f"WarmStart: dense/kernel has shape [8, 32] in the model but [8, 16] in {source}/ckpt-30; "
        f"leave it out of WarmStart.vars_regex='dense/'."
    )
    assert not os.path.exists(model_dir / "checkpoint")


def test_a_variable_missing_from_the_checkpoint_is_one_sentence(project, tmp_path):
    """A checkpoint of a model with the first layer only: '.*' also selects dense_1, which it lacks."""
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="dense")])
    prefix = tf.train.Checkpoint(model=other).save(str(tmp_path / "other" / "ckpt"))
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, *FROZEN, *warm(prefix)), 2)
    assert error_line(out) == (
        f"WarmStart: dense_1/kernel, dense_1/bias (matched by vars_regex='.*') not in {prefix}, "
        f"which holds dense/bias, dense/kernel; narrow WarmStart.vars_regex."
    )
    # Narrowed, the same checkpoint warm-starts the layer it has.
    expect_exit(train(project, model_dir, *FROZEN, *warm(prefix, "dense/")), 0)
    np.testing.assert_array_equal(
        weights(project, str(model_dir))["dense/kernel"], other.layers[0].kernel.numpy()
    )


# -- parameter_server: the variables live on the ps ----------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    "strategy, launch_args, chief",
    [
        ("parameter_server", ["--num_workers=1", "--num_ps=1"], "chief:0"),
        ("multi_worker_mirrored", ["--num_workers=2"], "worker:0"),
    ],
)
def test_warm_start_under_a_cluster(project, source, tmp_path, strategy, launch_args, chief):
    """From a one_device run's model_dir, via tfdist-launch: under parameter_server the chief
    assigns the variables on the ps; under multi_worker_mirrored every worker assigns its copy
    (the weights fingerprints agree at the end)."""
    model_dir = tmp_path / "model"
    args = train_args(
        model_dir, *FROZEN, "train.steps_per_loop=5", *warm(source), strategy=strategy
    )
    result = clusterlib.run(
        launch_cmd(launch_args, args), env=user_env(project), cwd=str(project), timeout=TIMEOUT_S
    )
    out = expect_exit(result, 0)
    assert any(
        line.startswith(f"[{chief}]") and "4 of 4 variables warm-started" in line
        for line in out.splitlines()
    ), out[-4000:]
    assert_same(weights(project, str(model_dir)), weights(project, str(source)), NAMES)
    assert step_values(model_dir) == {"global_step": 10, "optimizer_iterations": 10}
    assert report(model_dir)["warm_started"] == NAMES
    if strategy == "multi_worker_mirrored":
        prints = re.findall(r"^\[worker:\d\] .*weights fingerprint (\w+)$", out, re.M)
        assert len(prints) == 2 and len(set(prints)) == 1, f"the workers' weights: {prints}"
    assert clusterlib.no_process_left(str(model_dir)) == []


# -- the names ------------------------------------------------------------------------


def test_checkpoint_variable_names_of_the_model_child(source):
    """tf_compat.checkpoint_variable_names: the model's variables by their Keras path, not the
    optimizer's slots (which reach the same variables first in the object graph)."""
    prefix = tf.train.latest_checkpoint(str(source))
    names = tf_compat.checkpoint_variable_names(prefix, child="model")
    assert relative_names(sorted(names.values())) == sorted(NAMES)
    everything = tf_compat.checkpoint_variable_names(prefix)
    assert "global_step" in everything.values() and len(everything) > len(names)
    assert set(names) <= set(everything)
