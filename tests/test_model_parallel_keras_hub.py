"""model_parallel on models nobody here wrote: keras-hub's GPT-2 causal LM and BERT classifier.

Built from config with random weights (recipes/keras_hub, nothing downloaded). A
keras-hub task model is a thin functional model around ONE backbone layer holding
almost every weight, with GPT-2's token embedding reused as the LM head (tied
weights): the cases where a plan over `model.layers` puts everything on one device.

- A script (a fresh process: logical CPUs exist only if made before TF starts) builds
  the pipelined step's graph under 'auto' on 2 devices and reads the device of every
  matmul, forward and backward, against the placement table; and checks that 4
  micro-batches give the unpipelined gradients.
- The CLI: GPT-2 under model_parallel + multi_worker_mirrored (the tied embedding's
  summed gradient used to have no device and crash the all-reduce); a plan that leaves
  a device idle warns, or fails with require_balance; bad plans are one sentence.

Training under every strategy is the zoo's (tests/test_zoo_keras_hub_*.py).
"""

from __future__ import annotations

import re
import textwrap

import clusterlib
import pytest
from clusterlib import (
    REPO,
    assert_one_error_line,
    read_records,
    script_result,
    strategy_gin,
    train_cmd,
)

TIMEOUT_S = 240

GRAPH_SCRIPT = textwrap.dedent("""
    import json, re, sys
    import numpy as np
    from tfdist_trainer.plan.strategies import ModelParallel
    from tfdist_trainer.runtime import state as state_lib, strategies

    config = ModelParallel(plan="auto", num_devices=2, num_micro_batches=4, placement_file=None)
    strategies.prepare_devices(config)  # before TensorFlow starts
    import keras, tensorflow as tf
    from recipes.keras_hub import trainer as hub
    from tfdist_trainer.runtime.strategies.model_parallel import step as step_lib
    from tfdist_trainer.plan.model_parallel_plan import short_device

    keras.utils.set_random_seed(3)
    runtime = strategies.start(config)
    trainer = getattr(hub, sys.argv[1])(num_layers=2, hidden_dim=64, intermediate_dim=128, num_heads=2,
                                        seq_len=16, vocabulary_size=200, global_batch_size=8)
    state_lib.build_state(trainer, runtime.strategy, runtime=runtime)
    runtime.train_step_fn(trainer)
    placement = runtime.placement
    batch = next(iter(trainer.build_train_dataset(tf.distribute.InputContext())))

    def gradients_fn(micro_batches):
        @tf.function
        def fn(batch):
            return runtime.strategy.run(lambda b: step_lib.compute_gradients(
                trainer, b, num_micro_batches=micro_batches, loss_device=placement.loss_device())[:2],
                args=(batch,))
        return fn

    report = {"bytes": [d["bytes"] for d in placement.per_device()]}
    (loss_1, grads_1), (loss_4, grads_4) = gradients_fn(1)(batch), gradients_fn(4)(batch)
    pairs = [(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()) for a, b in zip(grads_1, grads_4)]
    report["num_gradients"] = len(pairs)
    report["same_loss"] = bool(np.isclose(float(loss_1), float(loss_4), rtol=1e-5))
    report["same_gradients"] = all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)
    report["max_abs_diff"] = max(float(np.max(np.abs(a - b))) for a, b in pairs)

    # Every matmul, forward and backward, against the table: an op belongs to the deepest placed
    # piece whose path its name scope follows (Keras adds _N to scopes; gradients/ in front).
    pieces = [(p, short_device(placement.devices[placement.device_index(u)]))
              for u in placement.units for p in u.aliases]
    def scope(path):
        parts = "/".join(re.escape(c) + r"(_\\d+)?" for c in path.split("/"))
        return re.compile(r"^(gradients(_\\d+)?/)?[^/]+/" + parts + "/")
    pieces = [(scope(p), p, d) for p, d in pieces]
    graph = gradients_fn(4).get_concrete_function(batch).graph
    report["checked"], report["wrong"] = {"forward": {}, "backward": {}}, []
    for op in graph.get_operations():
        if op.type not in ("MatMul", "BatchMatMulV2", "Einsum"):
            continue
        found = [(p, d) for rx, p, d in pieces if rx.match(op.name)]
        if not found:
            continue
        path, planned = max(found, key=lambda f: f[0].count("/"))
        actual = short_device(op.device)
        kind = "backward" if op.name.startswith("gradients") else "forward"
        report["checked"][kind][actual] = report["checked"][kind].get(actual, 0) + 1
        if actual != planned:
            report["wrong"].append([op.name, actual, planned, path])
    print("RESULT " + json.dumps(report))
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("trainer", ["GPT2LMTrainer", "BertClassifierTrainer"])
def test_auto_splits_the_backbone_and_every_matmul_runs_where_the_table_says(trainer):
    result = clusterlib.run([clusterlib.PYTHON, "-c", GRAPH_SCRIPT, trainer], timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-5000:]
    report = script_result(result.stdout)
    share = [b / sum(report["bytes"]) for b in report["bytes"]]
    assert all(0.4 <= s <= 0.6 for s in share), report["bytes"]
    # Forward and backward matmuls of both stages were found, each on its stage's device.
    assert report["wrong"] == [], report["wrong"][:10]
    for kind in ("forward", "backward"):
        assert set(report["checked"][kind]) == {"CPU:0", "CPU:1"}, report["checked"]
    # Nested stages pipeline: 4 micro-batches give the unpipelined loss and gradients.
    assert report["num_gradients"] > 30, report
    assert report["same_loss"] and report["same_gradients"], report


def gpt2_args(model_dir: str, *bindings: str) -> list[str]:
    return [
        f"--gin_file={REPO}/configs/zoo/keras_hub_gpt2.gin",
        strategy_gin("model_parallel"),
        *[f"--gin_bindings={b}" for b in bindings],
        f"--model_dir={model_dir}",
    ]


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_tied_embedding_trains_under_model_parallel_with_data_parallel_workers(tmp_path):
    """GPT-2's LM head reuses the token embedding: its summed gradient is all-reduced like any other."""
    model_dir = str(tmp_path / "model")
    args = gpt2_args(
        model_dir,
        "model_parallel.num_micro_batches=2",
        "model_parallel.data_parallel='multi_worker_mirrored'",
        "train.train_steps=20",
    )
    result = clusterlib.run(clusterlib.launch_cmd(["--num_workers=2"], args), timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "strategy model_parallel with 2 replica(s) in sync" in result.stdout
    # The table says where the tied reuse runs.
    assert re.search(
        r"gpt2_backbone/token_embedding is also called by gpt2_causal_lm \(tied weights\): "
        r"that call runs on its owner's device worker:0/CPU:0",
        result.stdout,
    ), result.stdout[-5000:]
    fingerprints = re.findall(r"^\[(worker:\d)\].*weights fingerprint (\w+)", result.stdout, re.M)
    assert len(fingerprints) == 2 and fingerprints[0][1] == fingerprints[1][1], fingerprints
    losses = [r["loss"] for r in read_records(model_dir) if r["kind"] == "train"]
    assert len(losses) == 2 and losses[-1] < losses[0], losses


UNBALANCED = "model_parallel.plan={'gpt2_backbone': 0, 'token_embedding': 0}"


def test_a_plan_that_leaves_a_device_idle_warns_and_require_balance_fails(tmp_path):
    warned = clusterlib.run(
        train_cmd(*gpt2_args(str(tmp_path / "warn"), UNBALANCED, "train.train_steps=2")),
        timeout=TIMEOUT_S,
    )
    assert warned.returncode == 0, warned.stdout[-5000:]
    warning = (
        "device CPU:1 holds 0% of the parameter bytes (fair share 50%); the largest layer placed "
        "whole is 'gpt2_backbone'"
    )
    assert warning in warned.stdout
    assert "split it with a nested pattern, e.g. model_parallel.plan = {'gpt2_backbone/" in (
        warned.stdout
    )
    failed = clusterlib.run(
        train_cmd(
            *gpt2_args(str(tmp_path / "fail"), UNBALANCED, "model_parallel.require_balance=True")
        ),
        timeout=TIMEOUT_S,
    )
    assert_one_error_line(failed, 2, warning, "model_parallel.require_balance = False")


def test_a_pattern_matching_no_layer_at_any_depth_names_the_nested_paths(tmp_path):
    result = clusterlib.run(
        train_cmd(
            *gpt2_args(str(tmp_path / "m"), "model_parallel.plan={'transformer_layer_.*': 1}")
        ),
        timeout=TIMEOUT_S,
    )
    assert_one_error_line(
        result,
        2,
        "pattern 'transformer_layer_.*' matches no layer",
        "'gpt2_backbone/transformer_layer_0'",
    )


def test_more_devices_than_layers_holding_variables_is_one_error(tmp_path):
    result = clusterlib.run(
        train_cmd(
            f"--gin_file={REPO}/configs/keras_mnist.gin",
            strategy_gin("model_parallel"),
            "--gin_bindings=model_parallel.num_devices=16",
            f"--model_dir={tmp_path / 'm'}",
        ),
        timeout=TIMEOUT_S,
    )
    assert_one_error_line(
        result, 2, "model_parallel.num_devices=16 but model", "set model_parallel.num_devices <="
    )
