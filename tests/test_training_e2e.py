"""End to end: the MNIST Trainer trains under every strategy, in real processes on 127.0.0.1.

Each strategy is started twice: by `tfdist-launch` (one command, the launcher
plans the cluster) and by hand (one `tfdist-train` process per task, each with
its own TF_CONFIG, or with the classic --job_name/--*_hosts flags). Nothing of
TensorFlow is mocked; the checks read what a user reads: exit codes, the
``metrics.jsonl`` records, the checkpoints and the launcher's output.

The data is the offline digits set (clusterlib.FAST_MNIST), on which ~200
steps of the small CNN reach 0.93-0.96 test accuracy under every strategy; chance
is 0.1, so MIN_EVAL_ACCURACY leaves a wide margin for asynchronous PSS runs.
"""

from __future__ import annotations

import os
import re

import clusterlib
import pytest
import tensorflow as tf
from clusterlib import HandCluster, chief_gone_grace, launch_cmd, mnist_args, read_records

from tfdist_trainer.launch import console

# Synchronous strategies: ~0.93-0.96 test accuracy on the digits set after 200 steps.
SYNC_STEPS = 200
# Not a multiple of parameter_server.steps_per_loop: the last scheduled closure must be shortened.
PSS_STEPS = 205
MIN_EVAL_ACCURACY = 0.8
TIMEOUT_S = 240

PSS_LAYOUT = {"chief": 1, "worker": 2, "ps": 1}
# Replicas in sync each strategy must report: proves the strategy (and the 2 logical CPUs) were used.
REPLICAS = {"one_device": 1, "mirrored": 2, "multi_worker_mirrored": 2, "parameter_server": 1}


def assert_trained(model_dir: str, steps: int, context: str = "") -> dict:
    """The run in model_dir learned, stopped exactly at `steps`, and left no process behind."""
    records = read_records(model_dir)
    assert records, f"no records in {model_dir}/metrics.jsonl\n{context[-5000:]}"
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(train) >= 2, f"expected several train records, got {train}"
    train_steps = [r["step"] for r in train]
    # One writer only (the chief): steps strictly increase, no record is duplicated.
    assert train_steps == sorted(set(train_steps)), (
        f"train records out of order or duplicated: {train_steps}"
    )
    assert train[0]["loss"] > train[-1]["loss"], f"loss did not fall: {[r['loss'] for r in train]}"
    # Metrics updated by concurrent parameter_server workers must not lose updates (Keras 3's
    # read-modify-write assign_add once let accuracy exceed 1 there).
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in train), f"train accuracy out of [0, 1]: {train}"
    assert train[-1]["step"] == steps, (
        f"last train record at step {train[-1]['step']}, want {steps}"
    )
    assert evals, f"no eval record in {model_dir}/metrics.jsonl"
    assert evals[-1]["step"] == steps, f"last eval at step {evals[-1]['step']}, want {steps}"
    assert evals[-1]["eval_accuracy"] > MIN_EVAL_ACCURACY, (
        f"eval accuracy {evals[-1]['eval_accuracy']}"
    )
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest is not None and latest.endswith(f"ckpt-{steps}"), f"latest checkpoint {latest}"
    assert clusterlib.throw_away_checkpoints(model_dir) == []
    assert clusterlib.no_process_left(model_dir) == []
    return {
        "first_loss": train[0]["loss"],
        "last_loss": train[-1]["loss"],
        "eval_accuracy": evals[-1]["eval_accuracy"],
    }


def assert_strategy_used(output: str, strategy: str) -> None:
    expected = f"strategy {strategy} with {REPLICAS[strategy]} replica(s) in sync"
    assert expected in output, f"'{expected}' is not in the output:\n{output[-5000:]}"


def assert_role_prefixed(output: str, log_dir: str, roles: list[str]) -> None:
    """Every line a task wrote to its log file reached the launcher's stdout prefixed with its role,
    in the console's short format (`console.short_line`: absl's header cut to the time and level).

    Known TensorFlow chatter is the exception: the console filter keeps it in the
    log file only. A line may be missing from stdout only when the filter drops it
    even in its most lenient state (the job finished), so anything it would show
    must be there.
    """
    lines = set(output.splitlines())
    for role in roles:
        prefix = f"[{role}]"
        path = os.path.join(log_dir, role.replace(":", "-") + ".log")
        assert os.path.getsize(path) > 0, f"{path} is empty"
        shown = console.ConsoleFilter(job_finished=lambda: True, serving_routine=False)
        with open(path, errors="replace") as f:
            logged = [line.rstrip("\n") for line in f if line.strip()]
        logged = [line for line in logged if shown(console.strip_role(line))]
        # a lone process prints '[local]' on its own lines (only C++ and table lines, off the
        # console now, got its role from the launcher)
        own = (prefix, "[local]") if len(roles) == 1 else (prefix,)
        # (a ps with nothing but its routine serving lines has no console line of its own)
        assert not logged or any(line.startswith(own) for line in lines), (
            f"no {prefix} line in the launcher output"
        )
        # A line that already names its task (a cluster task's own '[worker:1]', a lone process's
        # '[local]') may pass through as it is; any other line must get the role prefix.
        missing = [
            line
            for line in logged
            if console.short_line(f"{prefix} {line}") not in lines
            and not (console.short_line(line) in lines and line.startswith((prefix, "[local]")))
        ]
        assert not missing, (
            f"{len(missing)} lines of {path} are not in stdout as '{prefix} ...': {missing[:3]}"
        )


def run_launch(launch_args: list[str], train_args: list[str]):
    result = clusterlib.run(launch_cmd(launch_args, train_args), timeout=TIMEOUT_S)
    assert result.returncode == 0, (
        f"tfdist-launch exited {result.returncode}:\n{result.stdout[-8000:]}"
    )
    return result


# -- tfdist-launch ---------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    "strategy, launch_args, roles",
    [
        ("one_device", [], ["chief:0"]),
        ("mirrored", [], ["chief:0"]),
        ("multi_worker_mirrored", ["--num_workers=2"], ["worker:0", "worker:1"]),
    ],
)
def test_launch_trains_mnist(tmp_path, strategy, launch_args, roles):
    model_dir = str(tmp_path / "model")
    result = run_launch(launch_args, mnist_args(strategy, model_dir, SYNC_STEPS))
    assert_trained(model_dir, SYNC_STEPS, result.stdout)
    assert_strategy_used(result.stdout, strategy)
    assert sorted(os.listdir(os.path.join(model_dir, "logs"))) == [
        r.replace(":", "-") + ".log" for r in roles
    ]
    assert_role_prefixed(result.stdout, os.path.join(model_dir, "logs"), roles)
    if strategy == "multi_worker_mirrored":
        assert_workers_read_own_shards_and_agree(result.stdout)


def assert_workers_read_own_shards_and_agree(output: str) -> None:
    """Each worker fed its replica from its own pipeline (a plain iterator), and gradients were all-reduced."""
    for index in (0, 1):
        expected = f"[worker:{index}] "
        pipeline = f"training input: input pipeline {index} of 2, 1 local replica(s), a plain iterator on the host"
        assert any(
            line.startswith(expected) and pipeline in line for line in output.splitlines()
        ), f"no '{pipeline}' from worker {index}:\n{output[-5000:]}"
    fingerprints = dict(re.findall(r"^\[(worker:\d)\].*weights fingerprint (\w+)", output, re.M))
    assert len(fingerprints) == 2 and len(set(fingerprints.values())) == 1, fingerprints


@pytest.mark.cluster
def test_launch_parameter_server_with_evaluator(tmp_path):
    """chief + 2 workers + 1 ps + evaluator side-car; the step count is exact although 205 % 10 != 0."""
    model_dir = str(tmp_path / "model")
    result = run_launch(
        ["--num_workers=2", "--num_ps=1", "--evaluator"],
        mnist_args("parameter_server", model_dir, PSS_STEPS),
    )
    assert_trained(model_dir, PSS_STEPS, result.stdout)
    assert_strategy_used(result.stdout, "parameter_server")

    evaluator_records = read_records(model_dir, os.path.join("eval", "metrics.jsonl"))
    assert evaluator_records, f"the evaluator wrote no records:\n{result.stdout[-8000:]}"
    assert all(r["kind"] == "eval" for r in evaluator_records)
    assert evaluator_records[-1]["step"] == PSS_STEPS
    assert evaluator_records[-1]["eval_accuracy"] > MIN_EVAL_ACCURACY

    roles = ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]
    log_dir = os.path.join(model_dir, "logs")
    assert sorted(os.listdir(log_dir)) == sorted(r.replace(":", "-") + ".log" for r in roles)
    assert_role_prefixed(result.stdout, log_dir, roles)
    assert any(
        line.startswith("[chief:0]") and f"step {PSS_STEPS}/{PSS_STEPS}" in line
        for line in result.stdout.splitlines()
    )
    assert any(
        line.startswith("[evaluator:0]") and f"eval at step {PSS_STEPS}" in line
        for line in result.stdout.splitlines()
    )


# -- by hand: one tfdist-train per task ------------------------------------------


def run_hand_cluster(
    tmp_path, strategy: str, layout: dict[str, int], steps: int, *, use_flags: bool = False
) -> dict:
    model_dir = str(tmp_path / "model")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    args = mnist_args(strategy, model_dir, steps)
    hand = HandCluster(
        clusterlib.free_port_cluster(layout),
        args,
        str(log_dir),
        per_task_args=chief_gone_grace(strategy, 2),
        use_flags=use_flags,
    )
    codes = hand.run_all(timeout=TIMEOUT_S)
    logs = hand.logs()
    assert codes == {role: 0 for role in hand.procs}, f"exit codes {codes}\n{logs}"
    assert set(codes) == {f"{t}:{i}" for t, n in layout.items() for i in range(n)}
    assert_strategy_used("\n".join(hand.log(role) for role in hand.procs), strategy)
    return assert_trained(model_dir, steps, logs)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "strategy, layout, steps",
    [
        ("one_device", {"chief": 1}, SYNC_STEPS),
        ("mirrored", {"chief": 1}, SYNC_STEPS),
        ("multi_worker_mirrored", {"worker": 2}, SYNC_STEPS),
        ("parameter_server", PSS_LAYOUT, PSS_STEPS),
    ],
)
def test_hand_started_tf_config_cluster_trains_mnist(tmp_path, strategy, layout, steps):
    run_hand_cluster(tmp_path, strategy, layout, steps)


@pytest.mark.cluster
def test_classic_flags_start_parameter_server_cluster(tmp_path):
    """--job_name/--task_index/--ps_hosts/--worker_hosts/--chief_host give the same cluster as TF_CONFIG."""
    run_hand_cluster(tmp_path, "parameter_server", PSS_LAYOUT, PSS_STEPS, use_flags=True)
