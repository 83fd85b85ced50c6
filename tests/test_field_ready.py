"""Field-ready parameter_server clusters: workers read their own data, a lost worker does not end the job,
a serving task never mistakes a vanished chief for a finished job.

Every test runs real `tfdist-launch` / `tfdist-train` processes on 127.0.0.1 with the defaults a user
gets (no restart policy, `train.seed` set); faults are real signals. The partition watchdog needs
network namespaces and lives in test_multihost.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import time

import clusterlib
import numpy as np
import pytest
from clusterlib import FAST_MNIST, BackgroundJob, HandCluster, launch_cmd, strategy_gin
from faultlib import FaultRun, fault_run, step_before
from test_durability import (
    assert_finished_at,
    killed_before_the_end,
    read_log,
    record_fault,
    record_recovery,
    restored_steps,
)

TIMEOUT_S = 240
PSS_STEPS = 600

# -- 1. parameter_server workers read disjoint shares ---------------------------

NUM_IDS = 4096
ID_MODULE = textwrap.dedent(f'''
    """Counts, on the ps, which example ids each worker trains on."""

    import json
    import os

    import gin
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer, shard
    from tfdist_trainer.hooks import Hook

    NUM_IDS = {NUM_IDS}


    @gin.configurable
    class IdTrainer(Trainer):
        def build_model(self):
            # Created under the strategy's scope, so it lives on the ps like the model's variables.
            self.seen = tf.Variable(tf.zeros([2, NUM_IDS]), trainable=False, name="seen")
            return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

        def build_train_dataset(self, input_context):
            ids = shard(tf.data.Dataset.range(NUM_IDS), input_context).shuffle(NUM_IDS).repeat()
            return ids.map(lambda i: (tf.cast(i, tf.float32)[None] / NUM_IDS, i)).batch(
                self.per_replica_batch_size(input_context))

        def compute_loss(self, labels, predictions):
            return tf.reduce_sum(tf.square(predictions), axis=-1)

        def train_step(self, batch):
            features, ids = batch
            # The worker running this step, as TensorFlow knows it (independent of the data's context).
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            self.seen.scatter_nd_add(tf.stack([tf.fill(tf.shape(ids), worker), ids], axis=1),
                                     tf.ones(tf.shape(ids), tf.float32))
            return super().train_step((features, ids))


    @gin.configurable
    class DumpSeen(Hook):
        def end(self, run):
            with tf.io.gfile.GFile(os.path.join(run.model_dir, "seen.json"), "w") as f:
                f.write(json.dumps(run.trainer.seen.numpy().tolist()))
''')


@pytest.mark.cluster
def test_pss_workers_train_on_disjoint_shares_with_a_seed(tmp_path):
    """With train.seed set, two workers' example ids are disjoint: each trains on its own shard."""
    (tmp_path / "id_trainer.py").write_text(ID_MODULE)
    model_dir = str(tmp_path / "model")
    train_args = [
        "--module=id_trainer",
        strategy_gin("parameter_server"),
        "--gin_bindings=train.trainer_cls=@IdTrainer",
        "--gin_bindings=train.train_steps=200",
        "--gin_bindings=train.seed=42",
        "--gin_bindings=train.extra_hooks=[@DumpSeen()]",
        "--gin_bindings=Trainer.global_batch_size=16",
        f"--model_dir={model_dir}",
    ]
    result = clusterlib.run(
        launch_cmd(["--num_workers=2", "--num_ps=1"], train_args),
        env=clusterlib.user_env(tmp_path),
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-6000:]
    with open(os.path.join(model_dir, "seen.json")) as f:
        seen = np.array(json.load(f))
    ids = [set(np.flatnonzero(seen[w]).tolist()) for w in range(2)]
    assert seen.sum() == 200 * 16, f"{seen.sum()} examples counted for 200 steps of 16"
    assert ids[0] and ids[1], f"a worker trained on nothing: {len(ids[0])}, {len(ids[1])} ids"
    assert not ids[0] & ids[1], f"{len(ids[0] & ids[1])} ids trained on by both workers"
    for w in range(2):  # shard(): worker w reads every 2nd example starting at w
        assert all(i % 2 == w for i in ids[w]), f"worker {w} read ids outside its share"


# -- 2. a lost worker never ends the job -----------------------------------------


def pss_mnist_args(model_dir: str, steps: int = PSS_STEPS) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin("parameter_server"),
        f"--gin_bindings=train.train_steps={steps}",
        "--gin_bindings=train.log_every_n_steps=20",
        "--gin_bindings=train.checkpoint_every_n_steps=100",
        f"--model_dir={model_dir}",
    ]


def launched_pss(tmp_path, steps: int, *launch_flags: str, **fault) -> FaultRun:
    """A chief, 2 workers and a ps from tfdist-launch with its defaults (no restart policy),
    training into tmp_path/model, run to its end; `fault` is fault_run's."""
    return fault_run(
        pss_mnist_args(str(tmp_path / "model"), steps),
        tmp_path / "launch.out",
        launch_args=["--num_workers=2", "--num_ps=1", *launch_flags],
        timeout=TIMEOUT_S,
        **fault,
    )


@pytest.mark.cluster
def test_pss_worker_sigkill_with_the_default_policy_does_not_end_the_job(tmp_path):
    """kill -9 worker:1 under tfdist-launch's defaults (no restart): the job finishes exactly, exit 0."""
    model_dir = str(tmp_path / "model")
    run = launched_pss(tmp_path, PSS_STEPS, kill="worker:1", at_step=150)
    out = run.assert_launch_ok()
    run.assert_said(
        r"worker:1 exited with code 137 and is not restarted \(the Never policy does not retry "
        r"it\); the job goes on with 1 of 2 workers"
    )
    assert "restarting" not in out, out[-6000:]
    records = assert_finished_at(model_dir, PSS_STEPS, out)
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)), f"one run, no step counted twice: {steps}"
    killed_at = killed_before_the_end(run, PSS_STEPS, "the worker")
    chief_log = read_log(model_dir, "chief:0")
    assert restored_steps(chief_log) == [] and f"training done at step {PSS_STEPS}" in chief_log
    record_recovery(
        "pss: SIGKILL worker:1, default policy (Never)", records, run.fault_time, killed_at
    )


@pytest.mark.cluster
def test_pss_job_fails_in_one_sentence_when_no_worker_is_left(tmp_path):
    model_dir = str(tmp_path / "model")

    def kill_the_last_worker(job: BackgroundJob) -> None:
        job.wait_until(
            "the launcher going on without worker:1", lambda: "the job goes on" in job.output()
        )
        os.kill(job.task_pid("worker:0"), signal.SIGKILL)

    run = launched_pss(
        tmp_path, 5000, "--grace_s=3", kill="worker:1", at_step=1, after=kill_the_last_worker
    )
    assert run.code == 137, f"tfdist-launch exited {run.code}, want 137:\n{run.out[-6000:]}"
    run.assert_said(
        r"worker:0 exited with code 137 and was the last worker left; stopping the cluster because "
        r"no worker can run the job's steps"
    )
    assert clusterlib.no_process_left(model_dir) == []


def hand_started_pss(tmp_path, steps: int, **kwargs) -> HandCluster:
    """A chief, 2 workers and a ps, each a tfdist-train started by hand (as a user without the
    launcher would), training into tmp_path/model with their logs in tmp_path/logs."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    return HandCluster(
        clusterlib.free_port_cluster({"chief": 1, "worker": 2, "ps": 1}),
        pss_mnist_args(str(tmp_path / "model"), steps),
        str(log_dir),
        **kwargs,
    )


@pytest.mark.cluster
def test_hand_started_pss_survives_a_killed_worker_and_servers_exit_on_the_marker(tmp_path):
    """Classic flags, one process per task started by hand: kill -9 worker:1; the chief still ends exactly
    at train_steps and the remaining ps and worker exit 0 on the done marker."""
    model_dir = str(tmp_path / "model")
    steps = 400
    hand = hand_started_pss(tmp_path, steps, use_flags=True)
    try:
        hand.start_all()
        hand.wait_for_train_step(model_dir, 100, TIMEOUT_S)
        os.kill(hand.procs["worker:1"].pid, signal.SIGKILL)
        kill_time = time.time()
        codes = {role: hand.wait(role, TIMEOUT_S) for role in ("chief:0", "ps:0", "worker:0")}
    finally:
        hand.kill_all()
    assert codes == {"chief:0": 0, "ps:0": 0, "worker:0": 0}, (codes, hand.log("chief:0")[-4000:])
    records = assert_finished_at(model_dir, steps, hand.log("chief:0"))
    assert step_before(records, kill_time) < steps
    for role in ("ps:0", "worker:0"):
        assert "the chief marked training done: exiting" in hand.log(role), hand.log(role)[-3000:]


# -- 3. a serving task that loses its chief ---------------------------------------


@pytest.mark.cluster
def test_serving_tasks_exit_retryable_when_the_chief_vanishes(tmp_path):
    """kill -9 the chief: ps and workers give up after --chief_gone_grace_s with exit code 201 (retryable),
    never 0, because the job did not finish."""
    model_dir = str(tmp_path / "model")
    grace_s = 3
    hand = hand_started_pss(
        tmp_path,
        5000,
        per_task_args={t: [f"--chief_gone_grace_s={grace_s}"] for t in ("ps", "worker")},
    )
    try:
        hand.start_all()
        hand.wait_for_train_step(model_dir, 20, TIMEOUT_S)
        os.kill(hand.procs["chief:0"].pid, signal.SIGKILL)
        kill_time = time.monotonic()
        codes, exit_after = {}, {}
        for role in ("ps:0", "worker:0", "worker:1"):
            codes[role] = hand.wait(role, 120)
            exit_after[role] = time.monotonic() - kill_time
    finally:
        hand.kill_all()
    assert codes == {"ps:0": 201, "worker:0": 201, "worker:1": 201}, codes
    for role in codes:
        assert re.search(
            r"error: the chief at \S+ has been unreachable for \d+s \(--chief_gone_grace_s=3\) and "
            r"never marked training done; exiting with code 201 \(retryable\)",
            hand.log(role),
        ), hand.log(role)[-3000:]
    slowest = max(exit_after.values())
    record_fault(
        "pss: SIGKILL chief, seen by the serving tasks",
        step_at_kill="-",
        restored="- (tasks exit 201)",
        steps_lost="-",
        recover_s=slowest,
    )
    assert slowest >= grace_s
