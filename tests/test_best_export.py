"""BestExporter through the real `tfdist-train` command line: inline on the chief, and in the evaluator side-car.

The Trainer is test_hooks_cli's FaultyTrainer (test_user_module's small MLP on a
linearly separable set; it can sleep in every step). The checks read what a
user reads: the exit code, the log, ``metrics.jsonl`` (``eval/metrics.jsonl``
for the side-car), the exports and their ``best_export.json`` records, and the
best export reloaded with `tf.saved_model.load`, whose predictions must match
the checkpoint it came from.
"""

from __future__ import annotations

import json
import os
import re
import sys

import clusterlib
import numpy as np
import pytest
import tensorflow as tf
from clusterlib import launch_cmd
from test_hooks_cli import DIM, error_line, expect_exit, records, train, train_args, user_env
from test_hooks_cli import project as project  # noqa: PLC0414  (the module fixture, shared)

TIMEOUT_S = 180
RECORD = "best_export.json"


def improving_steps(evals: list[dict], metric: str, mode: str) -> list[int]:
    """The steps whose `metric` beat every earlier evaluation: where BestExporter must export."""
    steps, best = [], None
    for r in evals:
        value = r[metric]
        if best is None or (value < best if mode == "min" else value > best):
            steps.append(r["step"])
            best = value
    return steps


def exports(export_dir) -> dict[int, dict]:
    """{step: record} of the exports in export_dir; fails on anything else there."""
    found = {}
    for name in sorted(os.listdir(export_dir)):
        assert name.isdigit(), f"unexpected entry {name} in {export_dir}"
        with open(os.path.join(export_dir, name, RECORD)) as f:
            found[int(name)] = json.load(f)
    return found


def assert_records_match(found: dict[int, dict], evals: list[dict], metric: str, mode: str):
    by_step = {r["step"]: r for r in evals}
    for step, record in found.items():
        assert record["metric"] == metric and record["mode"] == mode, record
        assert record["step"] == step, record
        assert record["value"] == pytest.approx(by_step[step][metric], rel=1e-6), (record, evals)
        assert record["checkpoint"].endswith(f"ckpt-{step}"), record


def assert_best_is_exported(model_dir, metric: str = "eval_loss", mode: str = "min") -> dict:
    """The invariant of a run with BestExporter: the best `metric` metrics.jsonl holds is the value
    of the highest-step export, and that export is of a step metrics.jsonl evaluated; returns it."""
    evals = records(model_dir, "eval")
    assert evals, f"no eval record in {model_dir}/metrics.jsonl"
    values = [r[metric] for r in evals]
    best = min(values) if mode == "min" else max(values)
    found = exports(os.path.join(model_dir, "export", f"best_{metric}"))
    assert found, f"no export for the evaluations {evals}"
    top = found[max(found)]
    assert top["value"] == pytest.approx(best, rel=1e-6), (top, evals)
    assert max(found) in {r["step"] for r in evals if r[metric] == top["value"]}, (top, evals)
    return top


def launch(project, launch_args: list[str], args: list[str]) -> str:
    """A local cluster of the user's project through `tfdist-launch`; its output, once it exited 0."""
    result = clusterlib.run(
        launch_cmd(launch_args, args), env=user_env(project), cwd=str(project), timeout=TIMEOUT_S
    )
    return expect_exit(result, 0)


def model_from_checkpoint(project, checkpoint: str):
    """The user's model (MyTrainer's) built in this process with the checkpoint's weights."""
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    import my_trainers

    model = my_trainers.MyTrainer().build_model()
    tf.train.Checkpoint(model=model).read(
        checkpoint
    ).expect_partial().assert_existing_objects_matched()
    return model


def assert_export_matches_checkpoint(project, export_path, checkpoint: str) -> None:
    x = np.random.default_rng(3).normal(size=(128, DIM)).astype(np.float32)
    loaded = tf.saved_model.load(str(export_path))
    assert "serving_default" in loaded.signatures
    served = loaded.serve(tf.constant(x)).numpy()
    expected = model_from_checkpoint(project, checkpoint)(x, training=False).numpy()
    assert served.shape == (128, 1)
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    # A trained model, not a fresh one: predictions are far from a constant.
    assert served.std() > 0.5, served.std()


# -- inline on the chief (one_device) ----------------------------------------------


@pytest.fixture(scope="module")
def inline_run(project, tmp_path_factory):
    """60 steps, evaluated every 10: the default BestExporter (eval_loss, min) keeping 2, and a
    'worst' one (eval_loss, max) in an explicit export_dir keeping the default 3."""
    root = tmp_path_factory.mktemp("best_inline")
    model_dir, worst = root / "model", root / "worst"
    result = train(
        project,
        model_dir,
        "train.train_steps=60",
        "train.eval_every_n_steps=10",
        "train.keep_checkpoints=100",
        "train.extra_hooks=[@BestExporter(), @worst/BestExporter()]",
        "BestExporter.keep=2",
        "worst/BestExporter.mode='max'",
        f"worst/BestExporter.export_dir='{worst}'",
    )
    return model_dir, worst, result


def test_keeps_the_best_n_exports_each_with_its_record(inline_run):
    model_dir, _, result = inline_run
    out = expect_exit(result, 0)
    evals = records(model_dir, "eval")
    assert [r["step"] for r in evals] == [10, 20, 30, 40, 50, 60], evals
    improved = improving_steps(evals, "eval_loss", "min")
    assert len(improved) >= 3, f"the loss should fall at most evaluations: {evals}"
    export_dir = model_dir / "export" / "best_eval_loss"
    found = exports(export_dir)
    assert sorted(found) == improved[-2:], (sorted(found), improved)
    assert_records_match(found, evals, "eval_loss", "min")
    exported = re.findall(
        r"new best eval_loss=\S+ at step (\d+) .*; exported to \S+/best_eval_loss/", out
    )
    assert [int(s) for s in exported] == improved, (exported, improved)
    assert f"keeping the best 2: steps {sorted(improved[-2:], reverse=True)}" in out, out[-3000:]
    assert {r["evaluated_by"] for r in evals} == {"chief"}, evals
    assert_best_is_exported(model_dir)


def test_mode_max_exports_only_new_maxima(inline_run):
    model_dir, worst, result = inline_run
    expect_exit(result, 0)
    evals = records(model_dir, "eval")
    improved = improving_steps(evals, "eval_loss", "max")
    found = exports(worst)
    assert sorted(found) == improved[-3:], (sorted(found), improved, evals)
    assert 10 in found  # the first evaluation is always a best
    assert_records_match(found, evals, "eval_loss", "max")


def test_best_export_predicts_like_the_checkpoint_it_came_from(project, inline_run):
    model_dir, _, result = inline_run
    expect_exit(result, 0)
    export_dir = model_dir / "export" / "best_eval_loss"
    found = exports(export_dir)
    best = max(found)  # only improvements are exported: the newest is the best
    assert found[best]["value"] == min(r["value"] for r in found.values())
    assert_export_matches_checkpoint(project, export_dir / str(best), found[best]["checkpoint"])


def test_resumed_run_ranks_against_the_exports_it_finds(project, tmp_path):
    """mode='max' on a falling loss: the first run exports step 10 only; the resumed run finds it
    (and removes what an interrupted export left) and exports nothing new."""
    model_dir = tmp_path / "model"
    bindings = [
        "train.eval_every_n_steps=10",
        "train.extra_hooks=[@BestExporter()]",
        "BestExporter.mode='max'",
    ]
    expect_exit(train(project, model_dir, "train.train_steps=20", *bindings), 0)
    export_dir = model_dir / "export" / "best_eval_loss"
    assert sorted(exports(export_dir)) == [10]
    best = exports(export_dir)[10]["value"]
    (export_dir / ".tmp-30-0123456789ab").mkdir()  # an export killed before its rename
    (export_dir / "25").mkdir()  # an object-store export killed before its record
    out = expect_exit(train(project, model_dir, "train.train_steps=40", *bindings), 0)
    assert f"best eval_loss so far is {best:.6g} (step 10" in out, out[-3000:]
    assert "new best" not in out
    assert sorted(exports(export_dir)) == [10]
    evals = records(model_dir, "eval")
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    assert max(r["eval_loss"] for r in evals) == pytest.approx(best)


# -- bad inputs ----------------------------------------------------------------------


def test_metric_that_is_not_an_eval_metric_names_the_choices(project, tmp_path):
    model_dir = tmp_path / "model"
    out = expect_exit(
        train(
            project,
            model_dir,
            "train.train_steps=20",
            "train.eval_every_n_steps=10",
            "train.extra_hooks=[@BestExporter()]",
            "BestExporter.metric='eval_auc'",
        ),
        2,
    )
    assert error_line(out) == (
        "BestExporter.metric='eval_auc' is not an eval metric; choose one of "
        "['eval_accuracy', 'eval_examples', 'eval_loss']."
    )
    assert not os.path.exists(model_dir / "export")


@pytest.mark.parametrize(
    "binding, message",
    [
        ("BestExporter.mode='lowest'", "BestExporter.mode must be 'min' or 'max', got 'lowest'."),
        ("BestExporter.keep=0", "BestExporter.keep must be a positive integer, got 0."),
        (
            "BestExporter.metric=None",
            "BestExporter.metric must name an eval metric such as 'eval_loss', got None.",
        ),
    ],
)
def test_bad_settings_are_config_errors(project, tmp_path, binding, message):
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, "train.extra_hooks=[@BestExporter()]", binding), 2)
    assert error_line(out) == message
    assert not os.path.exists(model_dir / "checkpoint")


# -- in the evaluator side-car --------------------------------------------------------


@pytest.mark.cluster
def test_evaluator_side_car_exports_the_checkpoints_it_evaluated(project, tmp_path):
    """chief + evaluator (tfdist-launch --evaluator): the chief never exports; the evaluator
    exports each checkpoint that improved eval_loss, keeps the best 2, and the best export
    predicts like its checkpoint."""
    model_dir = tmp_path / "model"
    args = train_args(
        model_dir,
        "train.train_steps=80",
        "train.checkpoint_every_n_steps=10",
        "train.keep_checkpoints=100",
        "FaultyTrainer.sleep_s=0.1",  # about 1 s between checkpoints: the side-car sees several
        "train.extra_hooks=[@BestExporter()]",
        "BestExporter.keep=2",
    )
    out = launch(project, ["--evaluator"], args)
    chief = [line for line in out.splitlines() if line.startswith("[chief:0]")]
    side_car = [line for line in out.splitlines() if line.startswith("[evaluator:0]")]
    assert any("the evaluator task exports the best model" in line for line in chief), out[-4000:]
    assert not any("BestExporter: new best" in line for line in chief), out[-4000:]
    evals = clusterlib.read_jsonl(os.path.join(model_dir, "eval", "metrics.jsonl"))
    assert evals and evals[-1]["step"] == 80, evals
    improved = improving_steps(evals, "eval_loss", "min")
    assert len(improved) >= 3, f"the side-car should see several improving checkpoints: {evals}"
    found = exports(model_dir / "export" / "best_eval_loss")
    assert sorted(found) == improved[-2:], (sorted(found), improved, evals)
    assert_records_match(found, evals, "eval_loss", "min")
    exported = re.findall(r"new best eval_loss=\S+ at step (\d+)", "\n".join(side_car))
    assert [int(s) for s in exported] == improved, (exported, improved)
    # metrics.jsonl holds the evaluator's evaluations, once each, and no inline one.
    assert records(model_dir, "eval") == evals, (records(model_dir, "eval"), evals)
    assert {r["evaluated_by"] for r in evals} == {"evaluator"}, evals
    assert_best_is_exported(model_dir)
    best = max(found)
    assert_export_matches_checkpoint(
        project, model_dir / "export" / "best_eval_loss" / str(best), found[best]["checkpoint"]
    )
    assert clusterlib.no_process_left(str(model_dir)) == []


@pytest.mark.cluster
def test_inline_under_multi_worker_mirrored(project, tmp_path):
    """Two synchronous workers: both take part in the checkpoint of each improving step (a
    collective save), only the chief exports; no hang, no throw-away checkpoints left."""
    model_dir = tmp_path / "model"
    args = train_args(
        model_dir,
        "train.train_steps=30",
        "train.eval_every_n_steps=10",
        "train.checkpoint_every_n_steps=None",
        "train.keep_checkpoints=100",
        "train.extra_hooks=[@BestExporter()]",
        strategy="multi_worker_mirrored",
    )
    out = launch(project, ["--num_workers=2"], args)
    evals = records(model_dir, "eval")
    improved = improving_steps(evals, "eval_loss", "min")
    found = exports(model_dir / "export" / "best_eval_loss")
    assert sorted(found) == improved[-3:], (sorted(found), improved, evals)
    assert_records_match(found, evals, "eval_loss", "min")
    assert not any(
        line.startswith("[worker:1]") and "BestExporter: new best" in line
        for line in out.splitlines()
    ), out[-4000:]
    assert clusterlib.throw_away_checkpoints(model_dir) == []
    assert_best_is_exported(model_dir)
    best = max(found)
    assert_export_matches_checkpoint(
        project, model_dir / "export" / "best_eval_loss" / str(best), found[best]["checkpoint"]
    )
    assert clusterlib.no_process_left(str(model_dir)) == []


# -- through tf.io.gfile only ----------------------------------------------------------


def test_best_export_and_warm_start_with_file_uris(project, tmp_path):
    """model_dir, export_dir and WarmStart.checkpoint as file:// URIs: a stray open() or os.* call
    on them would fail (Python reads 'file://...' as a relative path)."""
    source, model_dir = f"file://{tmp_path}/source", f"file://{tmp_path}/model"
    expect_exit(
        train(
            project,
            source,
            "train.train_steps=20",
            "train.eval_every_n_steps=10",
            "train.extra_hooks=[@BestExporter()]",
        ),
        0,
    )
    found = exports(tmp_path / "source" / "export" / "best_eval_loss")
    assert sorted(found) and found[max(found)]["checkpoint"] == f"{source}/ckpt-{max(found)}"
    out = expect_exit(
        train(
            project,
            model_dir,
            "train.train_steps=10",
            "train.warm_start=@WarmStart()",
            f"WarmStart.checkpoint='{source}'",
        ),
        0,
    )
    assert f"warm start from {source}/ckpt-20 (vars_regex '.*'): 4 of 4" in out, out[-3000:]
    with open(tmp_path / "model" / "warm_start.json") as f:
        assert json.load(f)["checkpoint"] == f"{source}/ckpt-20"
    assert not (project / "file:").exists(), "a stray relative 'file:' directory was created"
