"""A large table that is whole gets one warning naming it, its size and the fix (issue 36).

A plain Keras `Embedding` trains under every strategy, only slowly: under parameter_server its
table sits whole on one ps, and under multi_worker_mirrored each lookup reads the whole table
(`GatherV2` of the table). The user's module here is such a model, run through `tfdist-launch`:

- at the default `train.whole_table_warning_mib` (64 MiB), an 80 MiB table under
  parameter_server with 2 ps: one 'sits whole on ps' warning; the placement line names the
  largest variable;
- with the knob at 1 MiB, a 2 MiB table under multi_worker_mirrored: one 'is read whole at every
  step' warning from the chief; with the knob at None, none;
- a bad value of the knob: one sentence and exit 2 before any task starts.
"""

from __future__ import annotations

import textwrap

import clusterlib
import pytest
from clusterlib import launch_cmd, strategy_gin

USER_MODULE = textwrap.dedent('''
    """Click-like model over one plain keras.layers.Embedding (not sharded)."""

    import gin
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer


    @gin.configurable
    class PlainEmbeddingTrainer(Trainer):
        def __init__(self, *, rows: int = 1000, width: int = 16, **kwargs):
            super().__init__(**kwargs)
            self.rows, self.width = rows, width

        def build_model(self):
            ids = keras.Input((2,), dtype="int64")
            x = keras.layers.Embedding(self.rows, self.width, name="item_table")(ids)
            x = keras.layers.Flatten()(x)
            return keras.Model(ids, keras.layers.Dense(1)(x))

        def build_optimizer(self):
            return keras.optimizers.SGD(0.1)

        def build_train_dataset(self, input_context):
            batch = self.per_replica_batch_size(input_context)
            ids = tf.random.stateless_uniform([4096, 2], [1, 2], 0, self.rows, tf.int64)
            labels = tf.cast(ids[:, :1] % 2, tf.float32)
            return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat().batch(batch)

        def compute_loss(self, labels, logits):
            return keras.losses.binary_crossentropy(labels, logits, from_logits=True)
''')

EXPERIMENT_GIN = textwrap.dedent("""
    import plain_embedding

    train.trainer_cls = @PlainEmbeddingTrainer
    train.train_steps = 20
    train.log_every_n_steps = 10
    train.checkpoint_every_n_steps = None
    Trainer.global_batch_size = 32
""")

WHOLE_ON_PS = "sits whole on ps"
READ_WHOLE = "is read whole at every step"


def _launch(project, strategy, launch_args, *bindings, expect=0):
    project.mkdir(parents=True, exist_ok=True)
    (project / "plain_embedding.py").write_text(USER_MODULE)
    (project / "plain.gin").write_text(EXPERIMENT_GIN)
    train_args = [
        "--gin_file=plain.gin",
        strategy_gin(strategy),
        f"--model_dir={project / strategy}",
        *[f"--gin_bindings={b}" for b in bindings],
    ]
    result = clusterlib.run(
        launch_cmd(launch_args, train_args),
        env=clusterlib.user_env(project),
        cwd=str(project),
        timeout=300,
    )
    assert result.returncode == expect, result.stdout[-6000:]
    return result.stdout


def _lines(stdout: str, text: str) -> list[str]:
    return [line for line in stdout.splitlines() if text in line]


@pytest.mark.cluster
def test_a_large_table_whole_on_one_ps_is_named_at_the_default_threshold(tmp_path):
    # 1,310,720 x 16 float32 = 80 MiB, above the default 64 MiB.
    stdout = _launch(
        tmp_path,
        "parameter_server",
        ["--num_workers=1", "--num_ps=2"],
        "PlainEmbeddingTrainer.rows=1310720",
    )
    (warning,) = _lines(stdout, WHOLE_ON_PS)
    assert warning.startswith("[chief:0]") and " W " in warning, warning
    assert "item_table/embeddings (80.0 MiB) sits whole on ps:" in warning, warning
    assert "tfdist_trainer.sharding.ShardedEmbedding" in warning and "from_keras_rs" in warning
    (placement,) = _lines(stdout, "variable placement:")
    assert "largest item_table/embeddings 80.0 MiB on ps:" in placement, placement


@pytest.mark.cluster
def test_a_table_read_whole_under_multi_worker_mirrored_is_named_and_the_knob_silences_it(
    tmp_path,
):
    stdout = _launch(
        tmp_path,
        "multi_worker_mirrored",
        ["--num_workers=2"],
        "PlainEmbeddingTrainer.rows=32768",  # 2 MiB
        "train.whole_table_warning_mib=1",
    )
    (warning,) = _lines(stdout, READ_WHOLE)
    assert warning.startswith("[worker:0]") and " W " in warning, warning
    assert "item_table/embeddings (2.0 MiB) is read whole" in warning, warning
    assert "under multi_worker_mirrored" in warning and "ShardedEmbedding" in warning, warning

    quiet = _launch(
        tmp_path / "quiet",
        "multi_worker_mirrored",
        ["--num_workers=2"],
        "PlainEmbeddingTrainer.rows=32768",
        "train.whole_table_warning_mib=None",
    )
    assert _lines(quiet, READ_WHOLE) == [] and _lines(quiet, WHOLE_ON_PS) == []


def test_a_bad_whole_table_threshold_is_one_sentence_before_any_task_starts(tmp_path):
    stdout = _launch(
        tmp_path,
        "multi_worker_mirrored",
        ["--num_workers=2"],
        "train.whole_table_warning_mib=-3",
        expect=2,
    )
    assert (
        "train.whole_table_warning_mib must be a positive number of MiB or None, got -3." in stdout
    ), stdout
    assert "[worker:" not in stdout, stdout
