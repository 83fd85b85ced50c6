"""A key mistake inside a user's model, in a real training step: one sentence and exit 2.

A recommender team's first run often feeds a table the wrong kind of id (int64 ids into a table
of string keys, float ids, ragged ids). The table's check raises a ConfigError while the step is
traced, inside Keras' layer call and AutoGraph, which both re-wrap other errors (Keras prepends
its arguments' dump, AutoGraph makes a StagingError: exit 1 and a 160-line traceback). Here the
user's Trainer is a project of its own, run by `tfdist-train` (one_device) and `tfdist-launch`
(parameter_server, where the chief traces the step for the workers).
"""

from __future__ import annotations

import textwrap

import clusterlib
import pytest
from clusterlib import assert_one_error_line, launch_cmd, strategy_gin, train_cmd

pytestmark = pytest.mark.cluster

USER_MODULE = textwrap.dedent('''
    import gin, keras
    import tensorflow as tf
    from tfdist_trainer import Trainer, sharding


    class UserModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.users = sharding.DynamicEmbedding(8, 256, key_dtype="string", name="user_table")
            self.head = keras.layers.Dense(1)

        def call(self, ids):
            return self.head(self.users(ids))


    @gin.configurable
    class UserIdsTrainer(Trainer):
        """User ids as the data has them: `ids` says which kind (the mistake under test)."""

        def __init__(self, ids="int64", **kwargs):
            super().__init__(**kwargs)
            self.ids = ids

        def build_model(self):
            return UserModel()

        def build_optimizer(self):
            return sharding.SparseAdagrad(0.1)

        def build_train_dataset(self, input_context):
            ids = tf.data.Dataset.range(1000)
            if self.ids == "float32":
                ids = ids.map(lambda i: tf.cast(i, tf.float32))
            elif self.ids == "ragged":
                ids = ids.map(lambda i: tf.RaggedTensor.from_row_lengths(
                    tf.fill([2], tf.as_string(i)), [1, 1]))
            return ids.map(lambda i: (i, 1.0)).batch(16, drop_remainder=True).repeat()

        def compute_loss(self, labels, predictions):
            return tf.square(predictions[:, 0] - labels)
''')


def _project(tmp_path, ids: str) -> list[str]:
    (tmp_path / "user_ids.py").write_text(USER_MODULE)
    (tmp_path / "user_ids.gin").write_text(
        textwrap.dedent(f"""
            import user_ids
            train.trainer_cls = @UserIdsTrainer
            train.train_steps = 4
            UserIdsTrainer.ids = "{ids}"
        """)
    )
    return ["--gin_file=user_ids.gin", f"--model_dir={tmp_path / 'model'}"]


@pytest.mark.parametrize(
    "ids, sentence",
    [
        ("int64", "user_table: key_dtype='string' but the keys are int64"),
        ("float32", "user_table:"),
        ("ragged", "user_table:"),
    ],
)
def test_a_key_mistake_in_a_traced_step_is_one_sentence_and_exit_2(tmp_path, ids, sentence):
    result = clusterlib.run(
        train_cmd(*_project(tmp_path, ids), strategy_gin("one_device")),
        env=clusterlib.user_env(tmp_path),
        cwd=str(tmp_path),
        timeout=120,
    )
    line = assert_one_error_line(result, 2, sentence)
    assert "Exception encountered" not in result.stdout and "\x1b[" not in line, result.stdout


def test_a_key_mistake_under_parameter_server_is_one_sentence_from_the_chief(tmp_path):
    result = clusterlib.run(
        launch_cmd(
            ["--num_workers=1", "--num_ps=1"],
            [*_project(tmp_path, "int64"), strategy_gin("parameter_server")],
        ),
        env=clusterlib.user_env(tmp_path),
        cwd=str(tmp_path),
        timeout=180,
    )
    assert_one_error_line(result, 2, "user_table: key_dtype='string' but the keys are int64")
    assert "Exception encountered" not in result.stdout, result.stdout[-5000:]
