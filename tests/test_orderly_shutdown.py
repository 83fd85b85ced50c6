"""A successful multi-worker job shuts down in order: no task logs gRPC errors after training.

Under multi_worker_mirrored the coordination service lives in worker:0's process; a worker that
outlives it logs `UNAVAILABLE ... Heartbeat ... Connection refused` at its next heartbeat. The test
makes worker:1 slow to finish (a user hook that sleeps at the end) and checks every per-task log.
Real `tfdist-launch` processes on 127.0.0.1, nothing mocked.
"""

from __future__ import annotations

import os
import re
import textwrap

import clusterlib
import pytest
from clusterlib import FAST_MNIST, base_env, launch_cmd, strategy_gin

from tfdist_trainer.launch import supervisor

TIMEOUT_S = 300
#: Longer than the coordination service's heartbeat interval, so that a leader that exits first is noticed.
SLOW_END_S = 15
SHUTDOWN_ERRORS = re.compile(r"Heartbeat|UNAVAILABLE|Connection refused")

SLOW_MODULE = textwrap.dedent(f'''
    """worker:1 finishes {SLOW_END_S}s after the others (e.g. a slow final upload)."""

    import time

    import gin

    from tfdist_trainer.hooks import Hook


    @gin.configurable
    class SlowEndOnWorker1(Hook):
        def end(self, run):
            if run.trainer.context.task_type == "worker" and run.trainer.context.task_index == 1:
                time.sleep({SLOW_END_S})
''')


def launch(tmp_path, launch_args, train_args):
    project = tmp_path / "project"
    project.mkdir()
    (project / "slow_end_hooks.py").write_text(SLOW_MODULE)
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([str(project), env["PYTHONPATH"]])
    model_dir = str(tmp_path / "model")
    result = clusterlib.run(
        launch_cmd(
            launch_args,
            [*FAST_MNIST, "--module=slow_end_hooks", f"--model_dir={model_dir}", *train_args],
        ),
        env=env,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"tfdist-launch exited {result.returncode}:\n{result.stdout[-8000:]}"
    )
    assert "job succeeded" in result.stdout
    return model_dir, result.stdout


def assert_no_shutdown_errors(model_dir: str, console: str, roles: list[str]) -> dict[str, str]:
    logs = os.path.join(model_dir, "logs")
    assert sorted(os.listdir(logs)) == sorted(r.replace(":", "-") + ".log" for r in roles)
    texts = {}
    for role in roles:
        with open(os.path.join(logs, role.replace(":", "-") + ".log"), errors="replace") as f:
            texts[role] = f.read()
        bad = [line for line in texts[role].splitlines() if SHUTDOWN_ERRORS.search(line)]
        assert not bad, f"{role} logged shutdown errors after a successful job:\n" + "\n".join(
            bad[:20]
        )
    assert not [line for line in console.splitlines() if SHUTDOWN_ERRORS.search(line)]
    return texts


@pytest.mark.cluster
def test_mwms_leader_exits_last_and_no_task_logs_shutdown_errors(tmp_path):
    model_dir, console = launch(
        tmp_path,
        ["--num_workers=2"],
        [
            strategy_gin("multi_worker_mirrored"),
            "--gin_bindings=train.train_steps=20",
            "--gin_bindings=train.extra_hooks=[@SlowEndOnWorker1()]",
        ],
    )
    texts = assert_no_shutdown_errors(model_dir, console, ["worker:0", "worker:1"])
    for role, text in texts.items():
        assert "training done at step 20" in text, f"{role}:\n{text[-4000:]}"
    assert "exiting last, as the coordination leader" in texts["worker:0"]


@pytest.mark.cluster
def test_parameter_server_servers_exit_in_order_without_shutdown_errors(tmp_path):
    """ps:0 leads the coordination service under parameter_server: it exits after the workers and ps:1."""
    model_dir, console = launch(
        tmp_path,
        ["--num_workers=2", "--num_ps=2"],
        [
            strategy_gin("parameter_server"),
            "--gin_bindings=train.train_steps=40",
            "--gin_bindings=parameter_server.steps_per_loop=10",
        ],
    )
    roles = ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1"]
    texts = assert_no_shutdown_errors(model_dir, console, roles)
    assert "training done at step 40" in texts["chief:0"]
    assert set(roles[1:]) <= set(supervisor.finished_tasks(console)), console[-4000:]
    assert "exiting last, as the coordination leader" in texts["ps:0"]
