"""parameter_server.data_service: every example of an epoch read once, through TF's tf.data service.

Real clusters from tfdist-launch (a dispatcher task, a tf.data worker in each
training worker's process). The data are ids 0..N-1; the user's train step
prints the ids of each batch it trains on (tf.print on the worker, into that
worker's log), so the test counts how often each id was trained on.
"""

from __future__ import annotations

import collections
import os
import re
import textwrap

import clusterlib
import pytest
from clusterlib import launch_cmd
from faultlib import fault_run

NUM_IDS = 20000
BATCH = 10
EPOCH_STEPS = NUM_IDS // BATCH
TIMEOUT_S = 300

IDS_MODULE = textwrap.dedent('''
    """A user's trainer whose data are ids; each training step prints the ids it trains on."""
    import gin
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer


    @gin.configurable
    class IdsTrainer(Trainer):
        def __init__(self, num_ids=100, python_in_data=False, **kwargs):
            super().__init__(**kwargs)
            self.num_ids = num_ids
            self.python_in_data = python_in_data

        def build_model(self):
            return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

        def build_train_dataset(self, input_context):
            ids = tf.data.Dataset.range(self.num_ids)  # one epoch: finite, not repeated
            if self.python_in_data:
                ids = ids.map(lambda i: tf.py_function(lambda v: v, [i], tf.int64))

            def example(i):
                x = tf.cast(i, tf.float32) / self.num_ids
                return tf.stack([x, 1.0 - x]), tf.reshape(x, [1]), i

            return ids.map(example).batch(self.per_replica_batch_size(input_context))

        def compute_loss(self, labels, predictions):
            return tf.reduce_mean(tf.square(labels - predictions), axis=-1)

        def train_step(self, batch):
            features, labels, ids = batch
            tf.print("TRAINED_IDS", ids, summarize=-1)
            return super().train_step((features, labels))
''')


def _train_args(model_dir: str, *extra: str) -> list[str]:
    return [
        clusterlib.strategy_gin("parameter_server"),
        "--module=ids_trainer",
        "--gin_bindings=train.trainer_cls=@IdsTrainer",
        f"--gin_bindings=IdsTrainer.num_ids={NUM_IDS}",
        f"--gin_bindings=IdsTrainer.global_batch_size={BATCH}",
        # More steps than the epoch has: the end of the data ends the run.
        f"--gin_bindings=train.train_steps={EPOCH_STEPS * 10}",
        "--gin_bindings=train.log_every_n_steps=50",
        "--gin_bindings=parameter_server.data_service=True",
        f"--model_dir={model_dir}",
        *extra,
    ]


def _env(tmp_path) -> dict[str, str]:
    (tmp_path / "ids_trainer.py").write_text(IDS_MODULE)
    return clusterlib.user_env(tmp_path)


def trained_ids(model_dir: str) -> tuple[collections.Counter, dict[str, int]]:
    """How often each id was trained on over every worker's log (all processes of each worker),
    and how many batches each worker trained on."""
    counts: collections.Counter = collections.Counter()
    batches = {}
    logs = os.path.join(model_dir, "logs")
    for name in sorted(os.listdir(logs)):
        if name.startswith("worker-"):
            with open(os.path.join(logs, name), errors="replace") as f:
                found = re.findall(r"TRAINED_IDS \[([\d ]*)\]", f.read())
            batches[name] = len(found)
            for batch in found:
                counts.update(int(i) for i in batch.split())
    return counts, batches


@pytest.mark.cluster
def test_one_epoch_under_two_workers_trains_on_every_id_exactly_once(tmp_path):
    model_dir = str(tmp_path / "model")
    result = clusterlib.run(
        launch_cmd(["--num_workers=2", "--num_ps=1"], _train_args(model_dir)),
        env=_env(tmp_path),
        timeout=TIMEOUT_S,
    )
    out = result.stdout
    assert result.returncode == 0, f"exit {result.returncode}:\n{out[-6000:]}"
    assert re.search(r"\[dispatcher:0\] .*tf\.data dispatcher at", out), out[-4000:]
    ended = re.search(r"the training data ended at step (\d+):", out)
    # Each tf.data worker batches the splits it reads: its last batch of the epoch may be partial.
    assert ended and EPOCH_STEPS <= int(ended.group(1)) <= EPOCH_STEPS + 2, out[-4000:]
    counts, batches = trained_ids(model_dir)
    assert set(counts) == set(range(NUM_IDS)), f"{NUM_IDS - len(counts)} ids never trained on"
    twice = {i: n for i, n in counts.items() if n != 1}
    assert not twice, f"ids trained on more than once: {dict(list(twice.items())[:20])}"
    assert len(batches) == 2 and all(batches.values()), f"a worker trained on nothing: {batches}"


def kill_mid_epoch(tmp_path, role: str, launch_flags: list[str]) -> tuple[str, collections.Counter]:
    """Runs a 2-worker served job, SIGKILLs `role` at step 100, and checks what every kill must
    keep: the job exits 0 after the kill, the epoch ends, no id is trained on twice. Returns the
    launcher's output and how often each id was trained on."""
    model_dir = str(tmp_path / "model")
    run = fault_run(
        _train_args(model_dir),
        tmp_path / "launch.out",
        launch_args=["--num_workers=2", "--num_ps=1", *launch_flags],
        kill=role,
        at_step=100,
        env=_env(tmp_path),
        timeout=TIMEOUT_S,
    )
    out = run.assert_launch_ok()
    run.assert_said(r"the training data ended at step (\d+):")
    assert any(r["time"] > run.fault_time for r in run.records), "the run ended before the kill"
    counts, _ = trained_ids(model_dir)
    twice = {i: n for i, n in counts.items() if n > 1}
    assert not twice, f"ids trained on more than once: {dict(list(twice.items())[:20])}"
    return out, counts


@pytest.mark.cluster
def test_a_worker_killed_mid_epoch_never_repeats_an_id(tmp_path):
    """SIGKILL worker:1 mid-epoch under the launcher's default policy (Never): the launcher brings it
    back all the same (the epoch waits for its tf.data worker), the epoch ends, no id is trained on
    twice, and the ids lost are those the dead worker held in flight."""
    out, counts = kill_mid_epoch(tmp_path, "worker:1", [])
    assert re.search(r"\[launch\] worker:1 must come back for the job to finish", out), out[-6000:]
    lost = NUM_IDS - len(counts)
    # What a dead tf.data worker and a dead reader held: the splits the dispatcher had handed the
    # killed worker's tf.data worker and the batches buffered for the killed reader.
    assert lost < NUM_IDS // 4, f"{lost} of {NUM_IDS} ids lost"
    print(
        f"\n[data_service] worker:1 SIGKILLed mid-epoch: {len(counts)} ids trained on once, "
        f"{lost} lost ({lost // BATCH} batches), none twice"
    )


@pytest.mark.cluster
def test_a_dataset_that_calls_python_is_one_sentence_and_exit_2(tmp_path):
    model_dir = str(tmp_path / "model")
    result = clusterlib.run(
        launch_cmd(
            ["--num_workers=1", "--num_ps=1"],
            _train_args(model_dir, "--gin_bindings=IdsTrainer.python_in_data=True"),
        ),
        env=_env(tmp_path),
        timeout=TIMEOUT_S,
    )
    out = result.stdout
    assert result.returncode == 2, f"exit {result.returncode}, want 2:\n{out[-6000:]}"
    assert re.search(
        r"error: parameter_server\.data_service=True serves the training data from tf\.data workers "
        r"that cannot run Python, but the dataset of IdsTrainer\.build_train_dataset calls Python",
        out,
    ), out[-6000:]
    assert "Traceback" not in out, out[-6000:]


@pytest.mark.cluster
def test_a_restarted_dispatcher_goes_on_with_the_epoch_from_its_journal(tmp_path):
    """SIGKILL the dispatcher mid-epoch under OnFailure: the launcher restarts it alone, it reads
    its journal under model_dir, and the epoch ends with no id trained on twice."""
    out, counts = kill_mid_epoch(
        tmp_path,
        "dispatcher:0",
        ["--restart_policy=OnFailure", "--backoff_limit=2", "--restart_backoff_s=1"],
    )
    assert re.search(r"dispatcher:0 exited with code 137; restarting dispatcher:0 in", out), out[
        -6000:
    ]
    lost = NUM_IDS - len(counts)
    # The splits the tf.data workers held went on being read while the dispatcher was down.
    assert lost <= 2 * BATCH, f"{lost} of {NUM_IDS} ids lost"
    print(
        f"\n[data_service] dispatcher SIGKILLed mid-epoch and restarted: {len(counts)} ids trained "
        f"on once, {lost} lost, none twice"
    )
