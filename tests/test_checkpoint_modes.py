"""`tfdist-train --mode=evaluate` and `--mode=export`, and `tfdist_trainer.evaluate/export`.

A checkpoint evaluated or exported without training again (Estimator's evaluate() and
export_saved_model()): one MNIST run under parameter_server (its checkpoint lives on a ps)
makes the checkpoint; the modes read it in one process, outside any cluster.
"""

from __future__ import annotations

import json
import os
import textwrap

import clusterlib
import pytest
from clusterlib import (
    FAST_MNIST,
    assert_one_error_line,
    launch_cmd,
    read_records,
    strategy_gin,
    train_cmd,
)

STEPS = 200


def mnist(model_dir: str, *extra: str) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin("parameter_server"),
        f"--gin_bindings=train.train_steps={STEPS}",
        f"--model_dir={model_dir}",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    model_dir = str(tmp_path_factory.mktemp("trained") / "model")
    result = clusterlib.run(launch_cmd(["--num_workers=2", "--num_ps=1"], mnist(model_dir)))
    assert result.returncode == 0, result.stdout[-6000:]
    return model_dir


@pytest.mark.cluster
def test_evaluate_mode_evaluates_the_newest_checkpoint_once(trained):
    result = clusterlib.run(train_cmd(*mnist(trained, "--mode=evaluate")))
    assert result.returncode == 0, result.stdout[-6000:]
    assert f"eval at step {STEPS}: eval_loss=" in result.stdout
    records = [r for r in read_records(trained) if r.get("evaluated_by") == "evaluate"]
    assert len(records) == 1 and records[0]["step"] == STEPS, records
    assert records[0]["checkpoint"].endswith(f"ckpt-{STEPS}")
    assert records[0]["eval_accuracy"] > 0.5, records


@pytest.mark.cluster
def test_export_mode_writes_a_servable_model_from_a_named_checkpoint(trained, tmp_path):
    export_dir = str(tmp_path / "exported")
    result = clusterlib.run(
        train_cmd(
            *mnist(
                trained,
                "--mode=export",
                f"--checkpoint={os.path.join(trained, f'ckpt-{STEPS}')}",
                f"--export_dir={export_dir}",
            )
        )
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert f"exported a SavedModel with a serving signature to {export_dir}" in result.stdout
    served = clusterlib.run(
        [
            clusterlib.PYTHON,
            "-c",
            textwrap.dedent(f"""
                import json, numpy as np, tensorflow as tf
                model = tf.saved_model.load({export_dir!r})
                out = model.serve(tf.zeros([3, 28, 28, 1]))
                print("SERVED " + json.dumps(list(out.shape)))
            """),
        ]
    )
    assert served.returncode == 0, served.stdout[-4000:]
    line = [x for x in served.stdout.splitlines() if x.startswith("SERVED ")]
    assert line and json.loads(line[0][len("SERVED ") :]) == [3, 10], served.stdout[-3000:]


@pytest.mark.cluster
def test_the_python_api_evaluates_and_exports(trained):
    script = textwrap.dedent(f"""
        import tfdist_trainer
        args = dict(model_dir={trained!r}, gin_files={[FAST_MNIST[0][len("--gin_file=") :]]!r},
                    gin_bindings={[b[len("--gin_bindings=") :] for b in FAST_MNIST[1:]]!r})
        values = tfdist_trainer.evaluate(**args)
        path = tfdist_trainer.export(**args)
        print("API", sorted(values), path)
    """)
    result = clusterlib.run([clusterlib.PYTHON, "-c", script])
    assert result.returncode == 0, result.stdout[-6000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("API ")]
    assert line and "'eval_accuracy'" in line[0] and line[0].endswith(f"export/ckpt-{STEPS}")


def test_a_model_dir_without_a_checkpoint_is_one_sentence(tmp_path):
    for mode in ("evaluate", "export"):
        result = clusterlib.run(train_cmd(*mnist(str(tmp_path / "empty"), f"--mode={mode}")))
        assert_one_error_line(result, 2, "holds no checkpoint", "--checkpoint=PATH")


@pytest.mark.cluster
def test_a_checkpoint_of_another_model_is_one_sentence(trained):
    result = clusterlib.run(
        train_cmd(*mnist(trained, "--mode=evaluate", "--gin_bindings=MnistTrainer.dense_units=64"))
    )
    assert_one_error_line(result, 2, "is not a checkpoint of MnistTrainer's model")


def test_training_on_from_a_checkpoint_of_another_model_is_one_sentence(tmp_path):
    # A Keras functional model saves its layers by position: a layer of another shape is met as a
    # variable of another shape (Keras' ValueError), not as a missing object.
    common = [
        *FAST_MNIST,
        strategy_gin("one_device"),
        "--gin_bindings=train.train_steps=2",
        f"--model_dir={tmp_path / 'model'}",
    ]
    first = clusterlib.run(train_cmd(*common))
    assert first.returncode == 0, first.stdout[-4000:]
    result = clusterlib.run(train_cmd(*common, "--gin_bindings=MnistTrainer.dense_units=64"))
    assert_one_error_line(result, 2, "is not a checkpoint of this model", "same model")
