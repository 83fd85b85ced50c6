"""A user's own Trainer, in a module outside the package, trained with `tfdist-launch`.

The test writes what a user writes: a module with a Trainer subclass (a small
MLP on a synthetic, linearly separable tf.data set: label = x.w > 0) and a gin
file that imports it. The same module and gin file then train under
multi_worker_mirrored and under parameter_server; between the two runs only
the strategy gin file changes (the launcher flags are the same too). The
``--module`` flag, instead of a gin ``import`` line, is checked once.
"""

from __future__ import annotations

import os
import textwrap

import clusterlib
import pytest
from clusterlib import launch_cmd, read_records, strategy_gin

STEPS = 200
MIN_EVAL_ACCURACY = 0.9  # the data is separable: ~0.97+ after 200 steps; chance is 0.5
TIMEOUT_S = 240

USER_MODULE = textwrap.dedent('''
    """A user's trainers: nothing here knows which strategy will run it."""

    import gin
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer, shard

    DIM = 8
    # A plain list: no TensorFlow op may run at import time, before the strategy exists.
    TRUE_W = [1.0, -2.0, 0.5, 3.0, -1.0, 0.0, 2.0, -0.5]


    def _examples(first: int, count: int) -> tf.data.Dataset:
        """Example i is a fixed random point (seeded by i) labelled by the side of a hyperplane."""
        def make(i):
            x = tf.random.stateless_normal([DIM], seed=tf.stack([i, tf.constant(7, tf.int64)]))
            y = tf.cast(tf.tensordot(x, tf.constant(TRUE_W), 1) > 0, tf.float32)[None]
            return x, y
        return tf.data.Dataset.range(first, first + count).map(make)


    @gin.configurable
    class MyTrainer(Trainer):
        def __init__(self, *, hidden: int = 16, learning_rate: float = 0.01, **kwargs):
            super().__init__(**kwargs)
            self.hidden = hidden
            self.learning_rate = learning_rate

        def build_model(self):
            return keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(self.hidden, activation="relu"),
                                     keras.layers.Dense(1)])

        def build_optimizer(self):
            return keras.optimizers.Adam(self.learning_rate)

        def build_train_dataset(self, input_context):
            dataset = shard(_examples(0, 4096), input_context)
            return (dataset.cache().shuffle(4096).repeat()
                    .batch(self.per_replica_batch_size(input_context), drop_remainder=True))

        def build_eval_dataset(self, input_context):
            return _examples(1_000_000, 1024).batch(self.eval_batch_size)

        def compute_loss(self, labels, predictions):
            return keras.losses.binary_crossentropy(labels, predictions, from_logits=True)

        def build_metrics(self):
            return [keras.metrics.BinaryAccuracy(threshold=0.0, name="accuracy")]
''')

EXPERIMENT_GIN = textwrap.dedent("""
    import my_trainers

    train.trainer_cls = @MyTrainer
    train.train_steps = {steps}
    train.log_every_n_steps = 50
    Trainer.global_batch_size = 64
    MyTrainer.learning_rate = 0.01
""")


@pytest.fixture
def user_project(tmp_path):
    """A user's directory, outside the package: my_trainers.py and my_experiment.gin."""
    (tmp_path / "my_trainers.py").write_text(USER_MODULE)
    (tmp_path / "my_experiment.gin").write_text(EXPERIMENT_GIN.format(steps=STEPS))
    # The same experiment for --module: no gin import line.
    (tmp_path / "my_experiment_no_import.gin").write_text(
        EXPERIMENT_GIN.format(steps=STEPS).replace("import my_trainers\n", "")
    )
    yield tmp_path  # conftest kills any process of this test left after a failure


def launch(project, launch_args: list[str], train_args: list[str], *, pythonpath: bool = True):
    env = clusterlib.base_env()
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(project), env["PYTHONPATH"]])
    result = clusterlib.run(
        launch_cmd(launch_args, train_args), env=env, cwd=str(project), timeout=TIMEOUT_S
    )
    assert result.returncode == 0, (
        f"tfdist-launch exited {result.returncode}:\n{result.stdout[-8000:]}"
    )
    return result


def assert_trained(model_dir: str, strategy: str, output: str) -> dict:
    records = read_records(model_dir)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(train) >= 2 and evals, f"records: {records}\n{output[-5000:]}"
    assert train[0]["loss"] > train[-1]["loss"], f"loss did not fall: {[r['loss'] for r in train]}"
    assert train[-1]["step"] == STEPS and evals[-1]["step"] == STEPS
    assert evals[-1]["eval_accuracy"] > MIN_EVAL_ACCURACY, (
        f"eval accuracy {evals[-1]['eval_accuracy']}"
    )
    with open(os.path.join(model_dir, "checkpoint")) as f:
        assert f'model_checkpoint_path: "ckpt-{STEPS}"' in f.read()
    assert f"under {strategy}" in output, f"the run did not use {strategy}"
    assert clusterlib.no_process_left(model_dir) == []
    return {
        "first_loss": train[0]["loss"],
        "last_loss": train[-1]["loss"],
        "eval_accuracy": evals[-1]["eval_accuracy"],
    }


@pytest.mark.cluster
def test_user_trainer_runs_under_two_strategies_changing_only_the_strategy_gin(user_project):
    # The same launcher flags for both: multi_worker_mirrored simply starts no ps.
    launch_args = ["--num_workers=2", "--num_ps=1"]
    for strategy, roles in (
        ("multi_worker_mirrored", {"worker-0.log", "worker-1.log"}),
        ("parameter_server", {"chief-0.log", "worker-0.log", "worker-1.log", "ps-0.log"}),
    ):
        model_dir = str(user_project / strategy)
        train_args = [
            "--gin_file=my_experiment.gin",
            strategy_gin(strategy),
            f"--model_dir={model_dir}",
        ]
        result = launch(user_project, launch_args, train_args)
        assert_trained(model_dir, strategy, result.stdout)
        assert set(os.listdir(os.path.join(model_dir, "logs"))) == roles


@pytest.mark.cluster
def test_module_flag_imports_the_user_trainer_from_the_working_directory(user_project):
    """--module my_trainers instead of a gin import line; found from the working directory alone."""
    model_dir = str(user_project / "one_device")
    train_args = [
        "--module=my_trainers",
        "--gin_file=my_experiment_no_import.gin",
        strategy_gin("one_device"),
        f"--model_dir={model_dir}",
    ]
    result = launch(user_project, [], train_args, pythonpath=False)
    assert_trained(model_dir, "one_device", result.stdout)
