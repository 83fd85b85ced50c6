"""The model zoo's wide_deep (configs/zoo/wide_deep.gin) trained under the strategies of zoo.RUNS (see tests/zoo.py)."""

from __future__ import annotations

import clusterlib
import pytest
import zoo


@pytest.mark.cluster
# one_device at steps_per_loop 1: keras_rs_dlrm (tests/zoo.py, RUNS).
@pytest.mark.parametrize("strategy", zoo.strategies("wide_deep"))
def test_wide_deep_trains_under_every_strategy(strategy, tmp_path):
    zoo.train_and_check("wide_deep", strategy, str(tmp_path / strategy))


def test_a_model_pipelining_cannot_run_is_one_sentence_and_exit_2(tmp_path):
    """The wide & deep Trainer brings its own train_step; pipelined model_parallel would replace it.

    A model that cannot run under the chosen strategy ends before any step, in one
    sentence naming the fix and exit code 2 (a configuration error), with no traceback
    and no checkpoint written.
    """
    model_dir = tmp_path / "run"
    result = clusterlib.run(
        clusterlib.train_cmd(
            f"--gin_file={clusterlib.REPO}/configs/zoo/wide_deep.gin",
            clusterlib.strategy_gin("model_parallel"),
            "--gin_bindings=model_parallel.num_micro_batches=2",
            f"--model_dir={model_dir}",
        ),
        timeout=180,
    )
    assert result.returncode == 2, result.stdout[-4000:]
    errors = [line for line in result.stdout.splitlines() if line.startswith("[local] error: ")]
    assert len(errors) == 1, result.stdout[-4000:]
    assert "ClickTrainer overrides train_step" in errors[0], errors
    assert "model_parallel.num_micro_batches = 1" in errors[0], errors
    assert "Traceback" not in result.stdout, result.stdout[-4000:]
    assert not list(model_dir.glob("ckpt-*")), list(model_dir.iterdir())
