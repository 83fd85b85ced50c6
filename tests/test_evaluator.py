"""The evaluator side-car: one evaluation schedule per run, falling behind, pinning, a quiet wait.

Cluster tests run the real `tfdist-launch` with test_hooks_cli's user project
(test_user_module's small MLP; FaultyTrainer sleeps in each step) and read
what a user reads: the console, the task logs, ``metrics.jsonl``, the
evaluator's journal ``eval/metrics.jsonl``, the checkpoints and the exports.
The invariant of every run with BestExporter: the best value metrics.jsonl
holds is the value of the highest-step export (test_best_export checks it
for one_device inline and with an evaluator, and multi_worker_mirrored).
In-process tests cover the pieces: the chief's checkpoint retention around a
pin, the quiet wait, the console.
"""

from __future__ import annotations

import os
import re
import textwrap

import clusterlib
import pytest
from test_best_export import assert_best_is_exported, launch
from test_hooks_cli import project as project  # noqa: PLC0414  (the module fixture, shared)
from test_hooks_cli import records, train_args

from tfdist_trainer.launch import console

EVALUATOR_HOOKS = textwrap.dedent('''
    """A user's hook that makes the evaluator slow, and notes whether its checkpoint outlives it."""

    import time

    import gin
    import tensorflow as tf
    from absl import logging

    from tfdist_trainer.hooks import Hook


    @gin.configurable
    class SlowEvaluation(Hook):
        def __init__(self, seconds: float = 1.0):
            self.seconds = seconds

        def after_side_car_eval(self, evaluation):
            time.sleep(self.seconds)
            logging.info(
                "after evaluating %s: still there: %s",
                evaluation.checkpoint,
                tf.io.gfile.exists(evaluation.checkpoint + ".index"),
            )
''')

#: "skipping 3 checkpoint(s) saved after step 20 (steps 30, 40, 50) to evaluate the newest, step 60"
SKIP_LINE = re.compile(
    r"skipping (\d+) checkpoint\(s\) saved (?:after step (\d+)|before this evaluator started) "
    r"\(steps ([\d, .]+)\) to evaluate the newest, step (\d+)"
)


def role_lines(out: str, role: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"[{role}]")]


def skipped_steps(log: str) -> dict[int, tuple[int, list[int]]]:
    """{evaluated step: (how many its skip line counts, the steps it names)}; a long list is
    named in part ("..."), a short one whole."""
    found = {}
    for count, _, named, step in SKIP_LINE.findall(log):
        steps = [int(s) for s in named.replace(", ...", "").split(", ")]
        assert "..." in named or len(steps) == int(count), named
        found[int(step)] = (int(count), steps)
    return found


def assert_one_schedule(model_dir, out: str, *, every: int, steps: int, by: str) -> list[int]:
    """One record per evaluated step in metrics.jsonl, all by `by`, the last at `steps`; with an
    evaluator, every eval point is evaluated or named in a skip line. Returns the evaluated steps."""
    evals = records(model_dir, "eval")
    evaluated = [r["step"] for r in evals]
    assert evaluated == sorted(set(evaluated)), f"an evaluation recorded twice: {evaluated}"
    assert {r["evaluated_by"] for r in evals} == {by}, evals
    assert evaluated[-1] == steps, f"the final checkpoint (step {steps}) was not evaluated: {evals}"
    points = list(range(every, steps + 1, every))
    if by == "chief":
        assert evaluated == points, evaluated
        return evaluated
    # The chief saved a checkpoint at each eval point for the evaluator, and evaluated none.
    chief = "\n".join(role_lines(out, "chief:0"))
    saved = [
        int(s) for s in re.findall(r"saved checkpoint \S+/ckpt-(\d+) in [\d.]+s\b", chief, re.M)
    ]
    assert saved == points, (saved, points)
    assert "eval at step" not in chief, chief[-3000:]
    assert "evaluation: by the evaluator task, of every checkpoint" in chief, chief[-3000:]
    journal = clusterlib.read_jsonl(os.path.join(model_dir, "eval", "metrics.jsonl"))
    assert journal == evals, (journal, evals)
    # Each evaluation after the first names exactly the eval points it skipped.
    skips = skipped_steps("\n".join(role_lines(out, "evaluator:0")))
    for before, after in zip(evaluated, evaluated[1:], strict=False):
        between = [s for s in points if before < s < after]
        count, named = skips.get(after, (0, []))
        assert count == len(between) and named == between[: len(named)], (after, skips, evaluated)
    return evaluated


def assert_quiet_wait(out: str, model_dir) -> None:
    """TF's once-a-second polling line is nowhere; the evaluator said it waits once."""
    with open(os.path.join(model_dir, "logs", "evaluator-0.log"), errors="replace") as f:
        evaluator_log = f.read()
    assert "Waiting for new checkpoint" not in out + evaluator_log
    waits = [line for line in evaluator_log.splitlines() if "waiting for" in line]
    assert len(waits) == 1 and "waiting for the first checkpoint" in waits[0], waits
    # The console shows the same line in its short format (launch.console.short_line).
    shown = [line for line in role_lines(out, "evaluator:0") if "waiting for" in line]
    assert shown == [console.short_line(line) for line in waits]


# -- parameter_server, with and without an evaluator ---------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize("evaluator", [True, False], ids=["evaluator", "inline"])
def test_parameter_server_one_schedule_and_the_best_is_exported(project, tmp_path, evaluator):
    """chief + 1 worker + 1 ps, eval every 50 of 300 steps, BestExporter on eval_loss. Inline the
    chief evaluates each eval point; with an evaluator the chief saves a checkpoint there instead and
    the evaluator evaluates it (or names it as skipped), the final one always."""
    model_dir = tmp_path / "model"
    args = train_args(
        model_dir,
        "train.trainer_cls=@MyTrainer",
        "train.train_steps=300",
        "train.log_every_n_steps=50",
        "train.eval_every_n_steps=50",
        "train.checkpoint_every_n_steps=None",
        "parameter_server.steps_per_loop=10",
        "train.extra_hooks=[@BestExporter()]",
        strategy="parameter_server",
    )
    out = launch(project, ["--num_workers=1", "--num_ps=1", *(["--evaluator"] * evaluator)], args)
    by = "evaluator" if evaluator else "chief"
    assert_one_schedule(model_dir, out, every=50, steps=300, by=by)
    top = assert_best_is_exported(model_dir)
    assert top["checkpoint"].endswith(f"ckpt-{top['step']}"), top
    if evaluator:
        assert_quiet_wait(out, model_dir)
        assert not os.path.exists(model_dir / "eval" / "pinned_checkpoint.json")
    assert clusterlib.no_process_left(str(model_dir)) == []


# -- an evaluator slower than the checkpoints ------------------------------------------


@pytest.mark.cluster
def test_a_slow_evaluator_skips_to_the_newest_and_keeps_what_it_reads(project, tmp_path):
    """one_device + evaluator, keep_checkpoints=1, a checkpoint every 10 steps (~0.3 s) and each
    evaluation 1 s longer: the evaluator evaluates the newest checkpoint each time, names the ones
    it skipped in one line, and the checkpoint it evaluates is still there when it is done."""
    (project / "evaluator_hooks.py").write_text(EVALUATOR_HOOKS)
    model_dir = tmp_path / "model"
    args = train_args(
        model_dir,
        "train.train_steps=200",
        "train.eval_every_n_steps=10",
        "train.checkpoint_every_n_steps=None",
        "train.keep_checkpoints=1",
        "FaultyTrainer.sleep_s=0.03",
        "train.extra_hooks=[@BestExporter(), @SlowEvaluation()]",
    ) + ["--module=evaluator_hooks"]
    out = launch(project, ["--evaluator"], args)
    evaluated = assert_one_schedule(model_dir, out, every=10, steps=200, by="evaluator")
    side_car = "\n".join(role_lines(out, "evaluator:0"))
    assert skipped_steps(side_car), f"the evaluator never fell behind: {evaluated}\n{side_car}"
    kept = re.findall(r"after evaluating \S+/ckpt-(\d+): still there: (\w+)", side_car)
    assert [int(s) for s, _ in kept] == evaluated, (kept, evaluated)
    assert all(there == "True" for _, there in kept), kept
    assert "keeping ckpt-" in "\n".join(role_lines(out, "chief:0"))
    left = sorted(n for n in os.listdir(model_dir) if n.endswith(".index"))
    assert "ckpt-200.index" in left and len(left) <= 2, left  # keep 1, and one spared at most
    assert_best_is_exported(model_dir)
    assert_quiet_wait(out, model_dir)


# -- multi_worker_mirrored: EarlyStopping on the evaluator's results ---------------------


@pytest.mark.cluster
def test_multi_worker_mirrored_stops_early_on_the_evaluators_results(project, tmp_path):
    """2 synchronous workers + evaluator. EarlyStopping (eval_loss, mode 'max', patience 2: the
    falling loss never improves on the first evaluation) acts on the evaluations the workers took
    from the evaluator at their eval points, all workers together; the checkpoint of the step they
    stopped at is evaluated last."""
    model_dir = tmp_path / "model"
    steps = 2000  # far more than it takes: the stop comes from the evaluator's third result
    args = train_args(
        model_dir,
        f"train.train_steps={steps}",
        "train.eval_every_n_steps=10",
        "train.checkpoint_every_n_steps=None",
        "FaultyTrainer.sleep_s=0.03",
        "train.extra_hooks=[@BestExporter(), @EarlyStopping()]",
        "EarlyStopping.mode='max'",
        "EarlyStopping.patience=2",
        strategy="multi_worker_mirrored",
    )
    out = launch(project, ["--num_workers=2", "--evaluator"], args)
    evals = records(model_dir, "eval")
    stop = int(re.search(r"^\[worker:0\] .*training done at step (\d+) ", out, re.M).group(1))
    assert stop < steps, out[-4000:]
    reason = f"eval_loss has not improved on {evals[0]['eval_loss']:.4f} for 2 evaluations"
    for worker in ("worker:0", "worker:1"):
        assert any(f"stopping early: {reason}" in line for line in role_lines(out, worker)), worker
    assert_one_schedule(
        model_dir, out.replace("[worker:0]", "[chief:0]"), every=10, steps=stop, by="evaluator"
    )
    assert len(evals) >= 3, evals
    assert_best_is_exported(model_dir)
    assert_quiet_wait(out, model_dir)
    assert clusterlib.throw_away_checkpoints(model_dir) == []


# -- the pieces, in this process --------------------------------------------------------


def test_the_chief_spares_the_pinned_checkpoint_and_only_it(tmp_path):
    """keep_checkpoints=1 through file:// (tf.io.gfile only): a pinned checkpoint survives the saves
    after it, the ones between it and the newest do not, and unpinning lets the next save sweep it."""
    import tensorflow as tf

    from tfdist_trainer.plan.cluster import ClusterConfig
    from tfdist_trainer.runtime import checkpoints

    model_dir = f"file://{tmp_path}"
    step = tf.Variable(0, dtype=tf.int64)
    checkpointer = checkpoints.Checkpointer(
        model_dir=model_dir,
        cluster=ClusterConfig(cluster={}, task_type=None, task_id=0),
        checkpoint=tf.train.Checkpoint(step=step),
        global_step=step,
        keep=1,
    )

    def save(n: int) -> list[int]:
        step.assign(n)
        checkpointer.save(n)
        return sorted(int(name[5:-6]) for name in os.listdir(tmp_path) if name.endswith(".index"))

    assert save(1) == [1] and save(2) == [2]
    checkpoints.pin(model_dir, f"{model_dir}/ckpt-2", by="evaluator:0")
    assert checkpoints.pinned(model_dir) == "ckpt-2"
    assert save(3) == [2, 3]
    assert save(4) == [2, 4]
    assert save(5) == [2, 5]
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-5")
    checkpoints.unpin(model_dir)
    assert checkpoints.pinned(model_dir) is None
    assert save(6) == [6]
    assert [
        os.path.basename(p)
        for p in tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths
    ] == ["ckpt-6"]


def test_the_wait_is_said_once_then_after_each_long_silence():
    from tfdist_trainer.runtime.evaluate import QuietWait

    now, said = [0.0], []
    wait = QuietWait(lambda fmt, *args: said.append(fmt % args), repeat_s=600, clock=lambda: now[0])
    for t in range(0, 1300):  # polled once a second
        now[0] = float(t)
        wait.waiting("the first checkpoint")
    assert said == [
        "waiting for the first checkpoint",
        "still waiting for the first checkpoint: nothing new for 600s",
        "still waiting for the first checkpoint: nothing new for 1200s",
    ]
    assert wait.silence_s() == 1299
    wait.active()  # a checkpoint came and was evaluated: the next waits start quiet again
    said.clear()
    for t in range(1300, 1800):
        now[0] = float(t)
        wait.waiting("a checkpoint after step 10")
    assert said == [] and wait.silence_s() == 499
    now[0] = 1900.0
    wait.waiting("a checkpoint after step 10")
    assert said == ["still waiting for a checkpoint after step 10: nothing new for 600s"]
