"""`train.profile_steps = (first, last)`: a TensorBoard profile of those steps, read back.

MNIST digits under one_device through the CLI; the trace must exist under
model_dir/train/plugins/profile and not be empty, and the loops must end around
the range (the progress records show the boundaries). A range past train_steps is
one sentence before TensorFlow starts.
"""

from __future__ import annotations

import glob
import os

import clusterlib
from clusterlib import FAST_MNIST, assert_one_error_line, strategy_gin, train_cmd


def mnist(model_dir: str, *bindings: str) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin("one_device"),
        "--gin_bindings=train.train_steps=60",
        "--gin_bindings=train.steps_per_loop=20",
        *[f"--gin_bindings={b}" for b in bindings],
        f"--model_dir={model_dir}",
    ]


def test_a_profile_of_the_chosen_steps_is_written_under_model_dir(tmp_path):
    model_dir = str(tmp_path / "m")
    result = clusterlib.run(train_cmd(*mnist(model_dir, "train.profile_steps=(25, 30)")))
    assert result.returncode == 0, result.stdout[-6000:]
    profile_dir = os.path.join(model_dir, "train", "plugins", "profile")
    assert f"profiling steps 25-30 into {profile_dir}" in result.stdout
    assert "profiling stopped at step 30" in result.stdout
    traces = glob.glob(os.path.join(profile_dir, "*", "*.xplane.pb"))
    assert traces and all(os.path.getsize(t) > 0 for t in traces), traces


def test_a_profile_range_past_the_last_step_is_one_sentence(tmp_path):
    result = clusterlib.run(train_cmd(*mnist(str(tmp_path / "m"), "train.profile_steps=(40, 80)")))
    assert_one_error_line(
        result,
        2,
        "train.profile_steps must be (first, last) with 1 <= first <= last <= "
        "train.train_steps=60, got (40, 80).",
    )
