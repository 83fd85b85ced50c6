"""The training task's own protocols as hooks (tfdist_trainer.runtime.train.task_hooks), in process.

Their order after the user's hooks, and what each does between loops, with model_dir
a file:// URI and a small stand-in for the run (only what these hooks read: the
cluster's role, the step, and the run's own `save_checkpoint` / `wait_for_checkpoints` over a
checkpointer that, like an asynchronous writer, makes a save durable only at `wait`). Real
runs: SIGTERM in tests/test_preemption.py, served data in tests/test_data_service.py.
"""

from __future__ import annotations

import os
import signal
import types

import gin
import pytest

from tfdist_trainer.errors import Preempted
from tfdist_trainer.hooks import CheckpointHook, StopTraining
from tfdist_trainer.io import markers, storage
from tfdist_trainer.runtime.train import task_hooks
from tfdist_trainer.runtime.train.run_context import RunContext


class PendingSaves:
    """A checkpointer whose saves are durable only once `wait` is called (an asynchronous
    writer's contract, `Checkpointer.save`); `events` is what happened, in order."""

    def __init__(self, events: list[tuple]):
        self.events = events
        self.steps: list[int] = []  # the durable ones
        self._pending: list[int] = []

    def save(self, step: int) -> None:
        self.events.append(("save", step))
        self._pending.append(step)

    def wait(self) -> None:
        for step in self._pending:
            self.events.append(("durable", step))
            self.steps.append(step)
        self._pending.clear()


class Summaries:
    def __init__(self):
        self.texts: list[tuple[str, str]] = []

    def text(self, name: str, tag: str, value: str) -> None:
        self.texts.append((name, tag))


def stand_in(model_dir: str, *, is_chief: bool = True, step: int = 40):
    """The run as these hooks see it; its save and wait are `RunContext`'s own."""
    events: list[tuple] = []
    run = types.SimpleNamespace(
        model_dir=model_dir,
        cluster=types.SimpleNamespace(is_chief=is_chief),
        step=step,
        checkpointer=PendingSaves(events),
        events=events,
        summaries=Summaries(),
        agree=lambda flag: flag,
    )
    run.save_checkpoint = types.MethodType(RunContext.save_checkpoint, run)
    run.wait_for_checkpoints = types.MethodType(RunContext.wait_for_checkpoints, run)
    return run


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_the_order_after_the_users_hooks(tmp_path, restore_sigterm):
    run = stand_in(f"file://{tmp_path}")
    hooks = task_hooks.task_hooks(run, answers_ps=True)
    assert [type(h).__name__ for h in hooks] == ["RunFiles", "StopWhenDataEnds", "SaveOnPreemption"]
    assert hooks[2].ps_requests is not None  # the parameter_server chief answers ps requests
    assert task_hooks.task_hooks(run, answers_ps=False)[2].ps_requests is None


def test_run_files_clear_the_done_marker_then_mark_the_final_step(tmp_path):
    model_dir = f"file://{tmp_path}"
    markers.mark_done(model_dir, 30)  # an earlier run finished at step 30
    run = stand_in(model_dir, step=60)
    hook = task_hooks.RunFiles()
    hook.begin(run)
    assert markers.read_marker(model_dir) is None  # side-cars keep following
    assert storage.read_text(storage.join(model_dir, "config.gin")).startswith("# command: ")
    assert run.summaries.texts == [("train", "config")]
    hook.end(run)
    assert markers.read_marker(model_dir)["step"] == 60
    assert os.path.exists(tmp_path / "operative_config.gin")
    # Only the chief writes them.
    worker_dir = tmp_path / "worker"
    worker = stand_in(f"file://{worker_dir}", is_chief=False)
    hook.begin(worker)
    hook.end(worker)
    assert not worker_dir.exists()
    gin.clear_config()


def test_the_done_marker_is_written_once_the_last_save_is_durable(tmp_path, monkeypatch):
    # The evaluator exits once it has evaluated the marked step, and a launcher reads the run
    # as finished: the final checkpoint must be complete first, even from an asynchronous writer.
    model_dir = f"file://{tmp_path}"
    run = stand_in(model_dir, step=60)
    real_mark_done = markers.mark_done
    monkeypatch.setattr(
        markers,
        "mark_done",
        lambda d, step: run.events.append(("done", step)) or real_mark_done(d, step),
    )
    for hook in [CheckpointHook(every_n_steps=None), task_hooks.RunFiles()]:  # build_run's order
        hook.end(run)
    assert run.events == [("save", 60), ("durable", 60), ("done", 60)]
    assert markers.read_marker(model_dir)["step"] == 60
    gin.clear_config()


def test_data_ending_stops_training_with_the_step():
    hook = task_hooks.StopWhenDataEnds()
    hook.after_loop(stand_in("unused"), types.SimpleNamespace(data_ended=False))
    with pytest.raises(StopTraining, match="the training data ended at step 40"):
        hook.after_loop(stand_in("unused"), types.SimpleNamespace(data_ended=True))


def test_sigterm_saves_after_the_loop_then_exits_retryable(tmp_path, restore_sigterm):
    run = stand_in(f"file://{tmp_path}")
    hook = task_hooks.SaveOnPreemption(run.model_dir, answers_ps=False)
    hook.after_loop(run, None)
    assert run.checkpointer.steps == []  # nothing asked: no save
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 40 after saving") as stopped:
        hook.after_loop(run, None)
    assert stopped.value.exit_code == 143 and run.checkpointer.steps == [40]


def test_a_preempted_ps_is_answered_by_the_save(tmp_path, restore_sigterm):
    model_dir = f"file://{tmp_path}"
    run = stand_in(model_dir, step=70)
    hook = task_hooks.SaveOnPreemption(model_dir, answers_ps=True)
    request = markers.request_save(model_dir, "ps:0")
    with pytest.raises(Preempted, match="ps:0 was preempted .*stopped at step 70"):
        hook.after_loop(run, None)
    assert run.checkpointer.steps == [70]
    assert markers.saved_step(model_dir, request) == 70


def test_the_ps_is_answered_and_the_task_exits_only_once_the_save_is_durable(
    tmp_path, restore_sigterm
):
    # The preempted ps exits on the answer: the checkpoint of its variables must be complete.
    model_dir = f"file://{tmp_path}"
    run = stand_in(model_dir, step=70)
    hook = task_hooks.SaveOnPreemption(model_dir, answers_ps=True)
    answer = hook.ps_requests.answer
    hook.ps_requests.answer = lambda requests, step: (
        run.events.append(("answered", step)) or answer(requests, step)
    )
    markers.request_save(model_dir, "ps:0")
    with pytest.raises(Preempted):
        hook.after_loop(run, None)
    assert run.events == [("save", 70), ("durable", 70), ("answered", 70)]


def test_the_loop_asks_between_calls_and_the_save_answers_what_it_saw(tmp_path, restore_sigterm):
    # The step loop asks between its calls; a ps request it saw is answered by the save that
    # follows, although model_dir is read at most once a second (a second read would find none).
    model_dir = f"file://{tmp_path}"
    run = stand_in(model_dir, step=55)
    hooks = task_hooks.task_hooks(run, answers_ps=True)
    stop = task_hooks.between_loops(run, hooks)
    assert not stop()
    request = markers.request_save(model_dir, "ps:0")
    assert not stop()  # read less than a second ago: not seen yet, the loop goes on
    hooks[2].ps_requests._next_read = 0.0  # a second later
    assert stop() and stop()  # seen, and kept
    with pytest.raises(Preempted, match="ps:0 was preempted .*stopped at step 55"):
        hooks[2].after_loop(run, None)
    assert run.checkpointer.steps == [55] and markers.saved_step(model_dir, request) == 55


def test_sigterm_is_agreed_once_then_kept(tmp_path, restore_sigterm):
    # Synchronous workers agree on a SIGTERM (one collective per check) until one is agreed;
    # the after_loop that saves then needs no further agreement, on every worker alike.
    votes: list[bool] = []
    run = stand_in(f"file://{tmp_path}")
    run.agree = lambda flag: votes.append(flag) or flag
    hook = task_hooks.SaveOnPreemption(run.model_dir, answers_ps=False)
    stop = task_hooks.between_loops(run, [hook])
    assert not stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop()
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 40"):
        hook.after_loop(run, None)
    assert votes == [False, True] and run.checkpointer.steps == [40]


def test_only_the_parameter_server_chief_answers_ps_save_requests():
    # The decision is the strategy runtime's (`answers_ps_save_requests`), not the task hooks'.
    from tfdist_trainer.plan.strategies.one_device import OneDevice
    from tfdist_trainer.plan.strategies.parameter_server import ParameterServer
    from tfdist_trainer.runtime.strategies.one_device import OneDeviceRuntime
    from tfdist_trainer.runtime.strategies.parameter_server import ParameterServerRuntime

    chief, worker = types.SimpleNamespace(is_chief=True), types.SimpleNamespace(is_chief=False)
    ps = ParameterServerRuntime(ParameterServer(), None, coordinator=object())
    assert ps.answers_ps_save_requests(chief) and not ps.answers_ps_save_requests(worker)
    assert not OneDeviceRuntime(OneDevice(), None).answers_ps_save_requests(chief)
