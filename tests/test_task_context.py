"""A user's Trainer sees its task through `self.context`, set by the run layer before `build_model`.

The user module of test_user_module gets a subclass that writes its context
into model_dir from `build_model`; the test runs it through the command line
as a user does: one process under one_device, then a real parameter_server
cluster (chief + 2 workers + 1 ps, and an evaluator) with `tfdist-launch`.
Under parameter_server only the chief and the evaluator build a Trainer (ps
and workers serve), and only the 2 workers compute training steps.
"""

from __future__ import annotations

import json
import os
import textwrap

import clusterlib
import pytest
from clusterlib import launch_cmd, strategy_gin, train_cmd, user_env
from test_user_module import USER_MODULE

TIMEOUT_S = 240

CONTEXT_TRAINER = textwrap.dedent('''

    import dataclasses, json, os


    @gin.configurable
    class ContextTrainer(MyTrainer):
        """Writes what it was told about its task, as it builds its model."""

        def build_model(self):
            context = dataclasses.asdict(self.context) if self.context is not None else None
            role = f"{self.context.task_type}-{self.context.task_index}" if self.context else "none"
            directory = os.path.join(self.context.model_dir if self.context else ".", "context")
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, f"{role}.json"), "w") as f:
                json.dump(context, f)
            return super().build_model()
''')

EXPERIMENT_GIN = textwrap.dedent("""
    import my_trainers

    train.trainer_cls = @ContextTrainer
    train.train_steps = 20
    train.log_every_n_steps = 10
    Trainer.global_batch_size = 16
""")


@pytest.fixture
def context_project(tmp_path):
    (tmp_path / "my_trainers.py").write_text(USER_MODULE + CONTEXT_TRAINER)
    (tmp_path / "my_experiment.gin").write_text(EXPERIMENT_GIN)
    yield tmp_path


def _contexts(model_dir: str) -> dict[str, dict]:
    directory = os.path.join(model_dir, "context")
    return {
        name[: -len(".json")]: json.load(open(os.path.join(directory, name)))  # noqa: SIM115
        for name in sorted(os.listdir(directory))
    }


def test_one_device_trainer_sees_a_lone_chief(context_project):
    model_dir = str(context_project / "one_device")
    result = clusterlib.run(
        train_cmd(
            "--gin_file=my_experiment.gin", strategy_gin("one_device"), f"--model_dir={model_dir}"
        ),
        env=user_env(context_project),
        cwd=str(context_project),
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    assert _contexts(model_dir) == {
        "chief-0": {
            "model_dir": model_dir,
            "task_type": "chief",
            "task_index": 0,
            "is_chief": True,
            "num_workers": 1,
            "strategy": "one_device",
        }
    }


@pytest.mark.cluster
def test_parameter_server_chief_and_evaluator_see_their_tasks(context_project):
    model_dir = str(context_project / "parameter_server")
    result = clusterlib.run(
        launch_cmd(
            ["--num_workers=2", "--num_ps=1", "--evaluator"],
            [
                "--gin_file=my_experiment.gin",
                strategy_gin("parameter_server"),
                f"--model_dir={model_dir}",
            ],
        ),
        env=user_env(context_project),
        cwd=str(context_project),
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"tfdist-launch exited {result.returncode}:\n{result.stdout[-8000:]}"
    )
    common = {"model_dir": model_dir, "num_workers": 2, "strategy": "parameter_server"}
    assert _contexts(model_dir) == {
        "chief-0": {**common, "task_type": "chief", "task_index": 0, "is_chief": True},
        "evaluator-0": {**common, "task_type": "evaluator", "task_index": 0, "is_chief": False},
    }
    assert clusterlib.no_process_left(model_dir) == []
