"""The public hook knobs, each through the real `tfdist-train` command line.

`EarlyStopping`, `ExportSavedModel`, `StopAtStep`, time-based checkpoints
(`CheckpointHook.every_n_seconds`), `NanGuard.max_retries` and
`train.extra_hooks` (with a user's own Hook subclass) are bound in gin exactly
as a user binds them; the checks read what a user reads: the exit code, the
log, ``metrics.jsonl``, the checkpoints, the exported SavedModel. Each knob
also gets a run with a value a user can get wrong.

The Trainer is test_user_module's small MLP on a synthetic, linearly separable
set (fast on 2 CPUs), subclassed in a user module written into a temporary
directory: it can sleep in every step and make the loss NaN at a chosen step.
Runs are one_device processes, except one multi_worker_mirrored cluster where
the workers must agree on time-based saves. Some runs are shared by several
tests (module fixtures) to keep the file within about two minutes.
"""

from __future__ import annotations

import ast
import datetime
import json
import math
import os
import re
import textwrap

import clusterlib
import numpy as np
import pytest
import tensorflow as tf
from clusterlib import launch_cmd, strategy_gin, train_cmd, user_env
from test_durability import checkpoint_steps, latest_step
from test_user_module import USER_MODULE

TIMEOUT_S = 120
LOG_EVERY = 10
BATCH = 64  # Trainer.global_batch_size in every run
DIM = 8  # test_user_module's feature size

HOOK_MODULE = textwrap.dedent('''
    """A user's module: a slow or faulty variant of MyTrainer, a counting metric and the user's own hook."""

    import json
    import time

    import gin
    import keras
    import tensorflow as tf

    from my_trainers import MyTrainer
    from tfdist_trainer.io import storage
    from tfdist_trainer.hooks import Hook


    class ExampleCount(keras.metrics.Metric):
        """How many examples the metric saw since its last reset."""

        def __init__(self, name="examples", **kwargs):
            super().__init__(name=name, **kwargs)
            self.count = self.add_variable(shape=(), initializer="zeros", name="count")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.count.assign_add(tf.cast(tf.shape(y_true)[0], self.count.dtype))

        def result(self):
            return tf.identity(self.count)


    @gin.configurable
    class FaultyTrainer(MyTrainer):
        """Sleeps `sleep_s` in every step; the labels (so the loss, gradients and weights) turn NaN at
        global step `nan_at_step`, the first `nan_times` times that step is taken."""

        def __init__(self, *, sleep_s: float = 0.0, nan_at_step: int = -1, nan_times: int = 0, **kwargs):
            super().__init__(**kwargs)
            self.sleep_s, self.nan_at_step, self.nan_left = sleep_s, nan_at_step, nan_times

        def _factor(self, step):
            time.sleep(self.sleep_s)
            if int(step) == self.nan_at_step and self.nan_left > 0:
                self.nan_left -= 1
                return float("nan")
            return 1.0

        def build_metrics(self):
            return super().build_metrics() + [ExampleCount()]

        def train_step(self, batch):
            features, labels = batch
            factor = tf.reshape(tf.py_function(self._factor, [self.step], tf.float32), [])
            return super().train_step((features, labels * factor))


    @gin.configurable
    class StepDiary(Hook):
        """The user's own hook: notes the step at each call, writes them to model_dir/diary.json at the end."""

        def __init__(self, every_n_steps: int = 7):
            self.every_n_steps = every_n_steps
            self.calls = {"begin": [], "after_loop": [], "end": []}

        def begin(self, run):
            self.calls["begin"].append(run.step)

        def after_loop(self, run, result):
            self.calls["after_loop"].append(run.step)

        def end(self, run):
            self.calls["end"].append(run.step)
            storage.write_text(storage.join(run.model_dir, "diary.json"), json.dumps(self.calls))
''')


# -- running the CLI ---------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The user's directory: my_trainers.py (test_user_module's) and hook_trainers.py."""
    path = tmp_path_factory.mktemp("user_project")
    (path / "my_trainers.py").write_text(USER_MODULE)
    (path / "hook_trainers.py").write_text(HOOK_MODULE)
    return path


def train_args(model_dir, *bindings: str, strategy: str = "one_device") -> list[str]:
    """FaultyTrainer from the user's module under `strategy`, plus gin `bindings`."""
    return [
        "--module=hook_trainers",
        strategy_gin(strategy),
        "--gin_bindings=train.trainer_cls=@FaultyTrainer",
        "--gin_bindings=train.seed=1",
        f"--gin_bindings=train.log_every_n_steps={LOG_EVERY}",
        f"--gin_bindings=Trainer.global_batch_size={BATCH}",
        *(f"--gin_bindings={b}" for b in bindings),
        f"--model_dir={model_dir}",
    ]


def train(project, model_dir, *bindings: str):
    """One tfdist-train process (one_device)."""
    return clusterlib.run(
        train_cmd(*train_args(model_dir, *bindings)),
        env=user_env(project),
        cwd=str(project),
        timeout=TIMEOUT_S,
    )


def expect_exit(result, code: int) -> str:
    out = result.stdout
    assert result.returncode == code, f"exit {result.returncode}, want {code}:\n{out[-6000:]}"
    return out


def error_line(out: str) -> str:
    """The one-sentence error the CLI printed ('[local] error: ...')."""
    lines = re.findall(r"^\[local\] error: (.*)$", out, re.M)
    assert len(lines) == 1, f"want exactly one error line, got {lines}:\n{out[-4000:]}"
    return lines[0]


def records(model_dir, kind: str) -> list[dict]:
    return [r for r in clusterlib.read_records(str(model_dir)) if r.get("kind") == kind]


def done_step(model_dir) -> int:
    with open(os.path.join(model_dir, "training_done")) as f:
        return json.load(f)["step"]


def assert_stopped_at(model_dir, out: str, step: int) -> None:
    """The run ended cleanly at `step`: log, final checkpoint, done marker, eval at `step`, no record past it."""
    assert f"training done at step {step} in" in out, out[-4000:]
    assert latest_step(str(model_dir)) == step, (
        f"latest checkpoint {checkpoint_steps(str(model_dir))}, want {step}"
    )
    assert done_step(model_dir) == step
    train, evals = records(model_dir, "train"), records(model_dir, "eval")
    assert train and max(r["step"] for r in train) <= step, (
        f"train records past step {step}: {train}"
    )
    assert evals and evals[-1]["step"] == step, f"no eval at the stop step {step}: {evals}"
    assert clusterlib.no_process_left(str(model_dir)) == []


# -- EarlyStopping ------------------------------------------------------------------


def assert_early_stop(model_dir, out: str, *, stop_step: int, monitor: str, patience: int) -> None:
    evals = records(model_dir, "eval")
    assert [r["step"] for r in evals] == list(range(10, stop_step + 1, 10)), evals
    # The best value is the first evaluation's: nothing after it counted as an improvement.
    reason = f"{monitor} has not improved on {evals[0][monitor]:.4f} for {patience} evaluations"
    assert f"stopping early: {reason}" in out, out[-4000:]
    assert_stopped_at(model_dir, out, stop_step)
    assert records(model_dir, "train")[-1]["step"] == stop_step


@pytest.fixture(scope="module")
def early_stop_export_run(project, tmp_path_factory):
    """EarlyStopping on eval_loss with mode='max' (the loss falls from step 10 to 20: no improvement),
    and two ExportSavedModel hooks: the default export_dir and a gin-scoped explicit one."""
    root = tmp_path_factory.mktemp("early_stop_export")
    model_dir, explicit = root / "model", root / "serving" / "mlp"
    result = train(
        project,
        model_dir,
        "train.train_steps=200",
        "train.eval_every_n_steps=10",
        "train.extra_hooks=[@EarlyStopping(), @ExportSavedModel(), @explicit/ExportSavedModel()]",
        "EarlyStopping.mode='max'",
        "EarlyStopping.patience=1",
        f"explicit/ExportSavedModel.export_dir='{explicit}'",
    )
    return model_dir, explicit, result


def test_early_stopping_mode_max_stops_at_the_first_non_improvement(early_stop_export_run):
    model_dir, _, result = early_stop_export_run
    assert_early_stop(
        model_dir, expect_exit(result, 0), stop_step=20, monitor="eval_loss", patience=1
    )


def train_early_stopping(project, model_dir, *settings: str):
    """200 steps, an evaluation every 10 (EarlyStopping acts on evaluations), and EarlyStopping
    configured by the gin bindings `settings`."""
    return train(
        project,
        model_dir,
        "train.train_steps=200",
        "train.eval_every_n_steps=10",
        "train.extra_hooks=[@EarlyStopping()]",
        *settings,
    )


def test_early_stopping_min_delta_and_patience(project, tmp_path):
    """No accuracy improves by min_delta=2: the second evaluation after the first one stops the run."""
    model_dir = tmp_path / "model"
    out = expect_exit(
        train_early_stopping(
            project,
            model_dir,
            "EarlyStopping.monitor='eval_accuracy'",
            "EarlyStopping.mode='max'",
            "EarlyStopping.min_delta=2.0",
            "EarlyStopping.patience=2",
        ),
        0,
    )
    assert_early_stop(model_dir, out, stop_step=30, monitor="eval_accuracy", patience=2)


def test_early_stopping_mode_must_be_min_or_max(project, tmp_path):
    model_dir = tmp_path / "model"
    out = expect_exit(
        train(
            project, model_dir, "train.extra_hooks=[@EarlyStopping()]", "EarlyStopping.mode='up'"
        ),
        2,
    )
    assert error_line(out) == "EarlyStopping.mode must be 'min' or 'max', got 'up'."
    assert not os.path.exists(model_dir / "checkpoint")


def test_early_stopping_unknown_monitor_names_the_choices(project, tmp_path):
    """Found at the first evaluation (the metric names come from the model): a configuration error, exit 2."""
    model_dir = tmp_path / "model"
    out = expect_exit(
        train_early_stopping(project, model_dir, "EarlyStopping.monitor='eval_auc'"), 2
    )
    assert error_line(out) == (
        "EarlyStopping.monitor='eval_auc' is not an eval metric; choose one of "
        "['eval_accuracy', 'eval_examples', 'eval_loss']."
    )


# -- ExportSavedModel ----------------------------------------------------------------


def true_weights() -> np.ndarray:
    """test_user_module's hyperplane: label = x.w > 0."""
    return np.array(
        ast.literal_eval(re.search(r"^TRUE_W = (\[.*\])$", USER_MODULE, re.M).group(1)), np.float32
    )


def test_export_saved_model_default_and_explicit_export_dir(early_stop_export_run):
    """The default export_dir is model_dir/export/<step>, at the step the run stopped (20)."""
    model_dir, explicit, result = early_stop_export_run
    out = expect_exit(result, 0)
    assert os.listdir(model_dir / "export") == ["20"]
    x = np.random.default_rng(0).normal(size=(256, DIM)).astype(np.float32)
    outputs = []
    for path in (model_dir / "export" / "20", explicit):
        assert f"exported a SavedModel with a serving signature to {path}" in out, out[-4000:]
        loaded = tf.saved_model.load(str(path))
        assert "serving_default" in loaded.signatures
        logits = loaded.serve(tf.constant(x)).numpy()
        assert logits.shape == (256, 1), logits.shape
        outputs.append(logits)
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6)
    # The trained weights were exported, not fresh ones (~0.5 of a separable set).
    accuracy = np.mean((outputs[0][:, 0] > 0) == (x @ true_weights() > 0))
    assert accuracy > 0.75, f"the exported model classifies {accuracy:.2f} of a separable set"


def test_export_saved_model_unusable_export_dir_is_one_sentence(project, tmp_path):
    model_dir, blocker = tmp_path / "model", tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = train(
        project,
        model_dir,
        "train.train_steps=20",
        "train.extra_hooks=[@ExportSavedModel()]",
        f"ExportSavedModel.export_dir='{blocker}/export'",
    )
    out = result.stdout
    assert result.returncode != 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert str(blocker) in error_line(out)
    assert latest_step(str(model_dir)) == 20  # the trained model is saved all the same


# -- StopAtStep, and a user's own hook in train.extra_hooks ---------------------------

STOP_AT = 37  # not a multiple of the log interval: the loop must end there for StopAtStep


@pytest.fixture(scope="module")
def stop_at_step_run(project, tmp_path_factory):
    """StopAtStep at 37 of 100 steps, after the user's StepDiary hook (every_n_steps=7)."""
    model_dir = tmp_path_factory.mktemp("stop_at_step") / "model"
    result = train(
        project,
        model_dir,
        "train.train_steps=100",
        "train.extra_hooks=[@StepDiary(), @StopAtStep()]",
        f"StopAtStep.last_step={STOP_AT}",
    )
    return model_dir, result


def test_stop_at_step_ends_exactly_at_last_step(stop_at_step_run):
    model_dir, result = stop_at_step_run
    out = expect_exit(result, 0)
    assert f"stopping early: StopAtStep reached step {STOP_AT}" in out, out[-4000:]
    assert_stopped_at(model_dir, out, STOP_AT)
    assert [r["step"] for r in records(model_dir, "train")][:3] == [10, 20, 30]


def test_stop_at_step_records_the_last_train_step(stop_at_step_run):
    model_dir, result = stop_at_step_run
    expect_exit(result, 0)
    assert records(model_dir, "train")[-1]["step"] == STOP_AT


def test_stop_at_step_without_last_step_is_a_config_error(project, tmp_path):
    out = expect_exit(train(project, tmp_path / "model", "train.extra_hooks=[@StopAtStep()]"), 2)
    assert (
        error_line(out)
        == "StopAtStep.__init__() missing 1 required positional argument: 'last_step'"
    )


def test_extra_hooks_runs_a_users_hook_from_a_user_module(stop_at_step_run):
    """StepDiary.every_n_steps=7 makes loops end at multiples of 7 besides the log interval (10);
    it runs before StopAtStep, so it sees step 37 too."""
    model_dir, result = stop_at_step_run
    expect_exit(result, 0)
    with open(model_dir / "diary.json") as f:
        diary = json.load(f)
    assert diary == {
        "begin": [0],
        "after_loop": [7, 10, 14, 20, 21, 28, 30, 35, STOP_AT],
        "end": [STOP_AT],
    }, diary


def test_extra_hooks_entry_that_is_not_a_hook(project, tmp_path):
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, "train.extra_hooks=['EarlyStopping']"), 2)
    assert (
        error_line(out)
        == "train.extra_hooks entries must be hooks such as @EarlyStopping(), got 'EarlyStopping'."
    )
    assert not os.path.exists(model_dir / "checkpoint")


# -- CheckpointHook.every_n_seconds --------------------------------------------------

SAVED = re.compile(
    r"^\[local\] I(\d{4} \d\d:\d\d:\d\d\.\d+) .*saved checkpoint \S*ckpt-(\d+) in [\d.]+s\b", re.M
)
TIME_BINDINGS = (
    "train.log_every_n_steps=5",
    "train.keep_checkpoints=100",
    "FaultyTrainer.sleep_s=0.04",
    "CheckpointHook.every_n_seconds=0.5",
)


def test_checkpoints_every_n_seconds_between_step_checkpoints(project, tmp_path):
    """Steps take >= 40 ms: saves come every ~0.5 s at loop ends (multiples of log_every_n_steps=5),
    besides the one at checkpoint_every_n_steps=50 and the final one."""
    model_dir, every_s, steps = tmp_path / "model", 0.5, 60
    expect_exit(
        train(
            project,
            model_dir,
            f"train.train_steps={steps}",
            "train.checkpoint_every_n_steps=50",
            *TIME_BINDINGS,
        ),
        0,
    )
    out = (model_dir / "logs" / "local.log").read_text()  # absl's header: the time to microseconds
    saves = [
        (datetime.datetime.strptime(t, "%m%d %H:%M:%S.%f"), int(s)) for t, s in SAVED.findall(out)
    ]
    steps_saved = [s for _, s in saves]
    assert steps_saved == checkpoint_steps(str(model_dir)), (
        steps_saved,
        checkpoint_steps(str(model_dir)),
    )
    by_time = [s for s in steps_saved if s not in (50, steps)]
    assert 50 in steps_saved and steps_saved[-1] == steps, steps_saved
    assert len(by_time) >= 2, (
        f"no time-based checkpoints besides steps 50 and {steps}: {steps_saved}"
    )
    assert all(s % 5 == 0 for s in by_time), (
        f"time-based saves must come at loop ends: {steps_saved}"
    )
    # Each time-based save comes at least every_n_seconds after the save before it.
    for (t0, s0), (t1, s1) in zip(saves, saves[1:]):
        if s1 in by_time:
            assert (t1 - t0).total_seconds() >= every_s, (
                f"ckpt-{s1} {t1 - t0} after ckpt-{s0}: {saves}"
            )


@pytest.mark.cluster
def test_checkpoints_every_n_seconds_under_multi_worker_mirrored(project, tmp_path):
    """The two workers agree on when a time-based save is due (each must take part in it): no hang,
    and the chief keeps time-based checkpoints (checkpoint_every_n_steps=None) before the final one."""
    model_dir, steps = tmp_path / "model", 40
    args = train_args(
        model_dir,
        f"train.train_steps={steps}",
        "train.checkpoint_every_n_steps=None",
        *TIME_BINDINGS,
        strategy="multi_worker_mirrored",
    )
    result = clusterlib.run(
        launch_cmd(["--num_workers=2"], args),
        env=user_env(project),
        cwd=str(project),
        timeout=TIMEOUT_S,
    )
    expect_exit(result, 0)
    saved = checkpoint_steps(str(model_dir))
    assert saved[-1] == steps and len(saved) >= 3, (
        f"want time-based checkpoints before step {steps}: {saved}"
    )
    assert all(s % 5 == 0 for s in saved), f"saves must come at loop ends: {saved}"
    assert clusterlib.throw_away_checkpoints(model_dir) == []
    assert clusterlib.no_process_left(str(model_dir)) == []


def test_every_n_seconds_must_be_a_number(project, tmp_path):
    out = expect_exit(
        train(
            project,
            tmp_path / "model",
            "train.train_steps=20",
            "CheckpointHook.every_n_seconds='often'",
        ),
        2,
    )
    assert "CheckpointHook.every_n_seconds" in error_line(out)


# -- NanGuard.max_retries -----------------------------------------------------------

NAN_STEP = 25
RETRY_LINE = (
    f"loss became nan at step {NAN_STEP}; restoring the checkpoint of step 20 and retrying (1/1)"
)


def nan_bindings(nan_times: int, checkpoint_every: int | None = 10) -> list[str]:
    return [
        "train.train_steps=40",
        f"train.checkpoint_every_n_steps={checkpoint_every}",
        "NanGuard.max_retries=1",
        f"FaultyTrainer.nan_at_step={NAN_STEP}",
        f"FaultyTrainer.nan_times={nan_times}",
    ]


@pytest.fixture(scope="module")
def nan_once_run(project, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("nan_once") / "model"
    return model_dir, train(project, model_dir, *nan_bindings(nan_times=1))


def test_nan_once_restores_the_last_checkpoint_and_retries(nan_once_run):
    model_dir, result = nan_once_run
    out = expect_exit(result, 0)
    assert out.count("retrying (") == 1 and RETRY_LINE in out, out[-4000:]
    assert f"restored {model_dir}/ckpt-20 (step 20)" in out, out[-4000:]
    train_records = records(model_dir, "train")
    assert [r["step"] for r in train_records] == [10, 20, 30, 40], train_records
    assert all(math.isfinite(r["loss"]) for r in train_records), train_records
    assert train_records[-1]["loss"] < train_records[0]["loss"], train_records
    assert math.isfinite(records(model_dir, "eval")[-1]["eval_loss"])
    assert checkpoint_steps(str(model_dir)) == [20, 30, 40]  # keep_checkpoints=3
    assert done_step(model_dir) == 40


def test_nan_retry_records_only_the_retried_steps(nan_once_run):
    model_dir, result = nan_once_run
    expect_exit(result, 0)
    counted = {r["step"]: r["examples"] for r in records(model_dir, "train")}
    assert counted == {step: LOG_EVERY * BATCH for step in (10, 20, 30, 40)}, counted


def test_nan_at_every_attempt_exits_1_after_max_retries(project, tmp_path):
    model_dir = tmp_path / "model"
    out = expect_exit(train(project, model_dir, *nan_bindings(nan_times=99)), 1)
    assert out.count("retrying (") == 1 and RETRY_LINE in out, out[-4000:]
    assert error_line(out) == (
        f"the training loss became NaN or Inf at step {NAN_STEP}; the last good checkpoint (step 20) is kept. "
        f"Lower the learning rate, check the data, or raise NanGuard.max_retries (its 1 used up)."
    )
    assert checkpoint_steps(str(model_dir)) == [10, 20]
    assert all(r["step"] <= 20 for r in records(model_dir, "train"))


def test_nan_retries_without_a_checkpoint_exit_1(project, tmp_path):
    """max_retries with checkpoint_every_n_steps=None: nothing to restore before the end, so no retry."""
    model_dir = tmp_path / "model"
    out = expect_exit(
        train(project, model_dir, *nan_bindings(nan_times=1, checkpoint_every=None)), 1
    )
    assert "retrying" not in out
    assert error_line(out) == (
        f"the training loss became NaN or Inf at step {NAN_STEP}; no checkpoint was written. "
        f"Lower the learning rate, check the data, or checkpoint more often (NanGuard retries "
        f"from a checkpoint)."
    )
    assert checkpoint_steps(str(model_dir)) == []
