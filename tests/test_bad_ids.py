"""An id past its table's rows, through `tfdist-launch` as a user runs it (issue 36): the launcher's
failure line names the table and its bound, the job exits non-zero, the failing task's graph
traceback is printed once, and the other tasks' follow-on lines ('RecvTensor cancelled', aborted
rendezvous) stay in their logs, counted in one line.

The user's module subclasses the sharded-embedding recipe's ClickTrainer and shifts one
categorical column of its training data past that table's vocabulary; ShardedEmbedding's check
then fails inside the training step's tf.function on a worker.
"""

from __future__ import annotations

import os
import re
import textwrap

import clusterlib
import pytest
from clusterlib import REPO, launch_cmd, strategy_gin

from tfdist_trainer.launch.console import ConsoleFilter, strip_role

TIMEOUT_S = 240
ROWS = 24  # table_3's vocabulary: the bound in the failure line

USER_MODULE = textwrap.dedent('''
    """A ClickTrainer whose training data holds ids past one table's rows."""

    import gin
    import tensorflow as tf

    from recipes.sharded_embedding.trainer import ClickTrainer


    @gin.configurable
    class BadIdsTrainer(ClickTrainer):
        def __init__(self, *, bad_column: int = 0, **kwargs):
            super().__init__(**kwargs)
            self.bad_column = bad_column

        def build_train_dataset(self, input_context):
            vocab = self.vocab_sizes[self.bad_column]
            shift = tf.one_hot(
                self.bad_column, len(self.vocab_sizes), on_value=vocab, off_value=0, dtype=tf.int64
            )

            def past_the_rows(features, labels):
                return {**features, "categorical": features["categorical"] + shift}, labels

            return super().build_train_dataset(input_context).map(past_the_rows)
''')

EXPERIMENT_GIN = textwrap.dedent(f"""
    import bad_ids

    train.trainer_cls = @BadIdsTrainer
    train.train_steps = 40
    ClickTrainer.vocab_sizes = [50, 40, 30, {ROWS}]
    ClickTrainer.step_report = False
    BadIdsTrainer.bad_column = 3
""")

FAILED = re.compile(r"^\[launch\] (?P<role>\S+) failed: (?P<cause>.*) \(traceback: (?P<log>\S+)\)$")
FOLLOW_ON_LINE = re.compile(r"^\[launch\] (?P<count>\d+) follow-on lines of a failed step ")


def _launch(project, launch_args: list[str], strategy: str):
    (project / "bad_ids.py").write_text(USER_MODULE)
    (project / "bad_ids.gin").write_text(EXPERIMENT_GIN)
    model_dir = project / strategy
    train_args = [
        f"--gin_file={REPO}/configs/sharded_embedding/tiny.gin",
        "--gin_file=bad_ids.gin",
        strategy_gin(strategy),
        f"--model_dir={model_dir}",
    ]
    result = clusterlib.run(
        launch_cmd(launch_args, train_args),
        env=clusterlib.user_env(project),
        cwd=str(project),
        timeout=TIMEOUT_S,
    )
    return result, model_dir


def _follow_on_in_logs(log_dir) -> int:
    """The follow-on records in the tasks' logs, counted by the launcher's own console filter."""
    count = 0
    for name in os.listdir(log_dir):
        keep = ConsoleFilter(gpu=False)
        with open(os.path.join(log_dir, name), errors="replace") as f:
            for line in f:
                keep(strip_role(line.rstrip("\n")))
        count += keep.follow_on
    return count


def _assert_one_clear_failure(result, model_dir) -> None:
    out = result.stdout
    lines = out.splitlines()
    assert result.returncode != 0, out[-8000:]
    failed = [m for m in map(FAILED.match, lines) if m]
    assert failed, out[-8000:]
    cause = failed[0].group("cause")
    assert f"table_3/embeddings: ids must be < {ROWS} (the rows)" in cause, failed[0].group(0)
    assert cause.startswith("InvalidArgumentError: assertion failed: "), failed[0].group(0)
    assert os.path.exists(failed[0].group("log"))
    # One traceback, one graph error: not the coordinator's copies of it as well.
    assert sum("Traceback (most recent call last)" in line for line in lines) == 1, out[-8000:]
    assert sum("Graph execution error" in line for line in lines) == 1, out[-8000:]
    # No pile of follow-on lines; those there are, counted in one line and kept in the logs.
    task_lines = [line for line in lines if not line.startswith("[launch] ")]
    assert not [line for line in task_lines if "RecvTensor cancelled" in line], out[-8000:]
    assert not [line for line in task_lines if "Cancelling rendezvous" in line], out[-8000:]
    counted = [m for m in map(FOLLOW_ON_LINE.match, lines) if m]
    assert len(counted) <= 1, out[-8000:]
    in_logs = _follow_on_in_logs(model_dir / "logs")
    assert (int(counted[0].group("count")) if counted else 0) == in_logs, out[-8000:]
    assert clusterlib.no_process_left(str(model_dir)) == []


@pytest.mark.cluster
def test_a_bad_id_under_parameter_server_names_the_table_and_its_bound(tmp_path):
    result, model_dir = _launch(tmp_path, ["--num_workers=1", "--num_ps=1"], "parameter_server")
    _assert_one_clear_failure(result, model_dir)


@pytest.mark.cluster
def test_a_bad_id_under_multi_worker_mirrored_names_the_table_and_its_bound(tmp_path):
    result, model_dir = _launch(tmp_path, ["--num_workers=2"], "multi_worker_mirrored")
    _assert_one_clear_failure(result, model_dir)
