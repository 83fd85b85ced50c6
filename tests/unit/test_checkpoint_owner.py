"""One owner of checkpoint saves, in process: every protocol asks `RunContext.save_checkpoint`,
waits for a durable save where it reads the files, tells another task or exits, and no reader
ever sees a checkpoint before its files are complete.

The hooks run against a stand-in for the run whose `save_checkpoint` / `wait_for_checkpoints`
are `RunContext`'s own, over a checkpointer that refuses a save asked any other way and, like
an asynchronous writer, makes a save durable only at `wait`. The evaluator side-car's pick
(model_dir's listed newest) is taken from a real `Checkpointer`'s model_dir at the moment its
``checkpoint`` file is rewritten, under both writers (CheckpointManager's, and the traced
write of a checkpoint that spans tasks).
"""

from __future__ import annotations

import types

import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management

from tfdist_trainer.errors import ClusterStalledError
from tfdist_trainer.hooks import BestExporter, CheckpointHook, EvalHook
from tfdist_trainer.io import storage
from tfdist_trainer.plan.cluster import ClusterConfig
from tfdist_trainer.runtime import checkpoint_actions, evaluate
from tfdist_trainer.runtime.checkpoints import Checkpointer
from tfdist_trainer.runtime.strategies.parameter_server import stall
from tfdist_trainer.runtime.train.run_context import RunContext


class OwnedSaves:
    """A checkpointer that accepts a save only from inside `RunContext.save_checkpoint`, and
    makes it durable only at `wait`; `events` is what happened, in order."""

    def __init__(self, events: list[tuple]):
        self.events = events
        self.inside_the_owner = False
        self.saves_without_the_workers = True
        self._pending: list[int] = []

    def save(self, step: int) -> None:
        assert self.inside_the_owner, "a save that did not go through RunContext.save_checkpoint"
        self.events.append(("save", step))
        self._pending.append(step)

    def wait(self) -> None:
        self.events.extend(("durable", step) for step in self._pending)
        self._pending.clear()

    def latest_step(self) -> int | None:
        return None


def stand_in(model_dir: str, *, step: int = 40, is_chief: bool = True, evaluator: bool = False):
    events: list[tuple] = []
    run = types.SimpleNamespace(
        model_dir=model_dir,
        cluster=types.SimpleNamespace(is_chief=is_chief),
        step=step,
        target_step=1000,
        has_evaluator_task=evaluator,
        last_eval={"eval_loss": 0.5},
        last_eval_step=step,
        checkpointer=OwnedSaves(events),
        events=events,
        agree=lambda flag: flag,
        log_info=lambda *args: None,
        refresh_step=lambda: None,
        take_evaluator_results=lambda: events.append(("took results",)),
        latest_checkpoint=lambda: events.append(("read latest",)) or f"{model_dir}/ckpt-{step}",
        export_saved_model=lambda path: events.append(("export",)) or storage.makedirs(path),
    )

    def save_checkpoint(*, durable: bool = False) -> None:
        run.checkpointer.inside_the_owner = True
        try:
            RunContext.save_checkpoint(run, durable=durable)
        finally:
            run.checkpointer.inside_the_owner = False

    run.save_checkpoint = save_checkpoint
    run.wait_for_checkpoints = types.MethodType(RunContext.wait_for_checkpoints, run)
    return run


def test_the_checkpoint_hook_saves_through_the_run(tmp_path):
    run = stand_in(f"file://{tmp_path}", step=40)
    hook = CheckpointHook(every_n_steps=20)
    hook.after_loop(run, None)
    run.step = 50
    hook.after_loop(run, None)  # not due
    hook.end(run)
    assert run.events == [("save", 40), ("save", 50)]  # durable at the task's end (RunFiles)


def test_the_eval_hook_saves_for_the_evaluator_task_through_the_run(tmp_path):
    run = stand_in(f"file://{tmp_path}", step=40, evaluator=True)
    EvalHook(every_n_steps=20).after_loop(run, None)
    # The evaluator sees the checkpoint once it is complete (the listing's rule): no wait here.
    assert run.events == [("save", 40), ("took results",)]


@pytest.mark.parametrize("is_chief", [True, False], ids=["chief", "peer"])
def test_best_export_reads_a_durable_checkpoint(tmp_path, is_chief):
    run = stand_in(f"file://{tmp_path}", step=40, is_chief=is_chief)
    BestExporter().after_loop(run, None)
    exported = [("read latest",), ("export",)] if is_chief else []
    assert run.events == [("save", 40), ("durable", 40), *exported]


def test_the_stall_save_is_durable_before_the_chief_exits(tmp_path):
    run = stand_in(f"file://{tmp_path}", step=40)
    final = types.MethodType(RunContext.final_save, run)()
    said = stall.save_after_stall(final, ClusterStalledError("stalled", []), timeout_s=30.0)
    assert said == "saved a checkpoint at step 40"
    assert run.events == [("save", 40), ("durable", 40)]


# -- readers never see a checkpoint before its files are complete ----------------------------


def real_checkpointer(model_dir: str, *, spans_tasks: bool, background: bool) -> Checkpointer:
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(global_step=step, weights=tf.Variable(tf.zeros([64, 8])))
    return Checkpointer(
        model_dir=model_dir,
        cluster=ClusterConfig(cluster={}),
        checkpoint=checkpoint,
        global_step=step,
        keep=5,
        spans_tasks=spans_tasks,
        background=background,
    )


def side_car_pick(model_dir: str) -> str | None:
    """The basename of the checkpoint the evaluator side-car would read now (the listed newest)."""
    latest = evaluate.SideCar.newer_checkpoint(
        types.SimpleNamespace(model_dir=model_dir, last_step=None)
    )
    return None if latest is None else latest.rsplit("/", 1)[-1]


@pytest.mark.parametrize("background", [False, True], ids=["sync", "background"])
@pytest.mark.parametrize("spans_tasks", [False, True], ids=["manager", "traced-write"])
def test_a_checkpoint_is_visible_to_readers_only_once_its_files_are_complete(
    tmp_path, monkeypatch, spans_tasks, background
):
    model_dir = f"file://{tmp_path}"
    checkpointer = real_checkpointer(model_dir, spans_tasks=spans_tasks, background=background)
    seen: list[tuple[str, str | None, int]] = []
    relist = checkpoint_management.update_checkpoint_state_internal

    def listing(save_dir, model_checkpoint_path, *args, **kwargs):
        newest = model_checkpoint_path.rsplit("/", 1)[-1]
        before = side_car_pick(model_dir)
        if newest != before:  # about to become visible: its files must be whole already
            step = tf.Variable(0, dtype=tf.int64)
            prefix = storage.join(model_dir, newest)
            tf.train.Checkpoint(global_step=step).read(prefix).expect_partial()
            seen.append((newest, before, int(step.numpy())))
        return relist(save_dir, model_checkpoint_path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", listing)
    for step in (100, 200):
        checkpointer.global_step.assign(step)
        checkpointer.save(step)
        checkpointer.wait()
        # Durable: listed once wait returned, for the side-car and for --mode=evaluate.
        assert side_car_pick(model_dir) == f"ckpt-{step}"
        assert checkpoint_actions.checkpoint_to_read(model_dir, None).endswith(f"/ckpt-{step}")
    # Each was still out of sight while its files were already complete (and read whole).
    assert seen == [("ckpt-100", None, 100), ("ckpt-200", "ckpt-100", 200)]
