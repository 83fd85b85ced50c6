"""model_parallel: layers placed on several (logical CPU) devices, optionally pipelined over micro-batches.

Logical CPUs must be configured before TensorFlow starts, so everything that
runs TF does so in a fresh subprocess: the real CLI (``python -m
tfdist_trainer.cli``, and ``tfdist_trainer.launch.main`` for two
multi_worker_mirrored workers) for training and for bad plans, and a small
script for what the CLI does not show (gradients of a pipelined vs an
unpipelined step, and where the backward ops run). What runs in this process
is pure Python: plan parsing, stage balancing, gin configs.

The training runs use configs/model_parallel_lm/tiny.gin (a 2-block byte-level
Transformer, SGD) on a generated text file, and compare model_parallel's
``metrics.jsonl`` losses with a one_device run of the same seed and data.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import subprocess
import textwrap

import clusterlib
import pytest
from clusterlib import (
    REPO,
    assert_one_error_line,
    base_env,
    read_records,
    script_result,
    strategy_gin,
    train_cmd,
)

from tfdist_trainer.runtime.strategies.model_parallel import placement as placement_lib

TIMEOUT_S = 240
PLAN_2 = "{'embed': 0, 'block_0': 0, 'block_1': 1, 'head': 1}"
EXPECTED_2 = {"embed": "CPU:0", "block_0": "CPU:0", "block_1": "CPU:1", "head": "CPU:1"}
# 'auto' over 4 devices: embed, block_0, block_1, head have about equal bytes: one per device.
EXPECTED_4 = {"embed": "CPU:0", "block_0": "CPU:1", "block_1": "CPU:2", "head": "CPU:3"}


# -- the CLI ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A few hundred KB of generated text (the same every run): the LM's training data."""
    rng = random.Random(0)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "for",
        "it",
        "as",
        "with",
        "was",
        "on",
        "be",
        "by",
        "this",
        "are",
        "from",
        "at",
        "or",
        "an",
        "which",
        "not",
        "have",
        "but",
        "they",
        "his",
        "model",
        "device",
        "layer",
        "stage",
        "batch",
        "gradient",
    ]
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 14))).capitalize() + "."
        for _ in range(3000)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines))
    return str(path)


def lm_args(
    corpus: str, model_dir: str, *bindings: str, strategy: str = "model_parallel"
) -> list[str]:
    return [
        f"--gin_file={REPO}/configs/model_parallel_lm/tiny.gin",
        strategy_gin(strategy),
        f"--gin_bindings=TransformerLMTrainer.data_glob='{corpus}'",
        *[f"--gin_bindings={b}" for b in bindings],
        f"--model_dir={model_dir}",
    ]


def train_losses(model_dir: str) -> list[float]:
    return [r["loss"] for r in read_records(model_dir) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """one_device; model_parallel on 2 devices (named plan); on 4 devices ('auto', 4 micro-batches).

    Started together (they are independent), so the module takes the time of the slowest.
    """
    root = tmp_path_factory.mktemp("runs")
    variants = {
        "one_device": lm_args(corpus, str(root / "one_device"), strategy="one_device"),
        "mp2": lm_args(corpus, str(root / "mp2"), f"model_parallel.plan={PLAN_2}"),
        "mp4_pipelined": lm_args(
            corpus,
            str(root / "mp4_pipelined"),
            "model_parallel.num_devices=4",
            "model_parallel.plan='auto'",
            "model_parallel.num_micro_batches=4",
        ),
    }
    procs = {
        name: subprocess.Popen(
            train_cmd(*args),
            env=base_env(),
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, args in variants.items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            results[name] = {"code": proc.returncode, "output": out, "model_dir": str(root / name)}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return results


def assert_ok(run: dict) -> None:
    assert run["code"] == 0, f"exit {run['code']}:\n{run['output'][-6000:]}"


def load_placement(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "placement.json")) as f:
        return json.load(f)


def assert_placed(placement: dict, expected: dict[str, str]) -> None:
    """Every layer, every one of its variables and their optimizer slots sit on the planned device."""
    layers = {row["layer"]: row for row in placement["layers"]}
    assert set(layers) == set(expected)
    for name, device in expected.items():
        row = layers[name]
        assert placement_lib.short_device(row["device"]) == device, row
        assert row["variables"], f"{name} has no variables"
        actual = {placement_lib.short_device(v["device"]) for v in row["variables"]}
        assert actual == {device}, f"{name}: variables on {actual}, planned {device}"
    assert placement["misplaced"] == []
    by_device = {placement_lib.short_device(d["device"]): d for d in placement["per_device"]}
    assert set(by_device) == set(expected.values())
    assert (
        sum(d["bytes"] for d in by_device.values()) == sum(r["bytes"] for r in layers.values()) > 0
    )


@pytest.mark.timeout(300)
def test_two_devices_place_named_layers_and_match_one_device(runs):
    one, mp = runs["one_device"], runs["mp2"]
    assert_ok(one)
    assert_ok(mp)
    assert "strategy model_parallel with 1 replica(s) in sync" in mp["output"]
    placement = load_placement(mp["model_dir"])
    assert_placed(placement, EXPECTED_2)
    # Built under their devices: nothing had to be moved afterwards.
    assert placement["moved_after_build"] == []
    # The placement is logged at start: one line per device on the console, then the table (one
    # row per layer) in the task's log.
    assert "model_parallel placement over 2 device(s)" in mp["output"]
    log = (pathlib.Path(mp["model_dir"]) / "logs" / "local.log").read_text(errors="replace")
    for layer, device in EXPECTED_2.items():
        assert any(
            line.split("]")[-1].split()[:1] == [layer] and line.rstrip().endswith(device)
            for line in log.splitlines()
        ), f"no table row for {layer} on {device}"
    assert re.search(r"  CPU:1: block_1 \.\. head \(2 pieces\); [\d,]+ params", mp["output"])
    reference, losses = train_losses(one["model_dir"]), train_losses(mp["model_dir"])
    assert len(reference) == len(losses) == 2 and reference[-1] < reference[0]
    assert losses == pytest.approx(reference, rel=1e-5)


@pytest.mark.timeout(300)
def test_four_devices_auto_pipelined_place_layers_and_match_one_device(runs):
    one, mp = runs["one_device"], runs["mp4_pipelined"]
    assert_ok(one)
    assert_ok(mp)
    assert "pipelines each replica batch over 4 micro-batches" in mp["output"]
    placement = load_placement(mp["model_dir"])
    assert placement["plan"] == "auto" and placement["num_micro_batches"] == 4
    assert_placed(placement, EXPECTED_4)
    optimizer_devices = {
        placement_lib.short_device(v["device"]) for v in placement["optimizer_variables"]
    }
    assert optimizer_devices <= set(EXPECTED_4.values())
    losses, reference = train_losses(mp["model_dir"]), train_losses(one["model_dir"])
    assert losses == pytest.approx(reference, rel=1e-4)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return clusterlib.run(train_cmd(*args), timeout=TIMEOUT_S)


def test_plan_naming_a_missing_device_fails_before_tensorflow(corpus, tmp_path):
    result = run_cli(
        *lm_args(corpus, str(tmp_path / "m"), "model_parallel.plan={'embed': 0, 'head': 5}")
    )
    assert_one_error_line(result, 2, "'head' on device 5", "num_devices=2")


def test_plan_pattern_matching_no_layer_is_one_error(corpus, tmp_path):
    result = run_cli(
        *lm_args(corpus, str(tmp_path / "m"), "model_parallel.plan={'embed': 0, 'blocks_.*': 1}")
    )
    assert_one_error_line(result, 2, "pattern 'blocks_.*' matches no layer", "'block_0'")


# -- gradients (a script), and multi_worker_mirrored workers (the launcher) ----------------------

GRADIENTS_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tfdist_trainer.plan.strategies import ModelParallel
    from tfdist_trainer.runtime.strategies.model_parallel import placement as placement_lib, step as step_lib
    from tfdist_trainer.runtime import state as state_lib, strategies
    from tfdist_trainer.errors import ConfigError

    corpus = sys.argv[1]
    config = ModelParallel(plan="auto", num_devices=4, num_micro_batches=4, placement_file=None)
    strategies.prepare_devices(config)  # before TensorFlow starts
    import keras, tensorflow as tf
    from recipes.model_parallel_lm.trainer import TransformerLMTrainer

    keras.utils.set_random_seed(3)
    config_settings = dict(vars(config))
    runtime = strategies.start(config)
    strategy = runtime.strategy
    trainer = TransformerLMTrainer(data_glob=corpus, seq_len=16, num_layers=2, d_model=16, num_heads=2, d_ff=32,
                                   global_batch_size=8)
    try:  # a step asked for before the runtime placed the model: one clear error
        runtime.train_step_fn(trainer)
        step_before_model = ""
    except ConfigError as e:
        step_before_model = str(e)
    state_lib.build_state(trainer, strategy, runtime=runtime)
    runtime.train_step_fn(trainer)
    placement = runtime.placement
    loss_device = placement.loss_device()
    batch = next(iter(trainer.build_train_dataset(tf.distribute.InputContext())))

    def gradients_fn(micro_batches):
        @tf.function
        def fn(batch):
            return strategy.run(lambda b: step_lib.compute_gradients(
                trainer, b, num_micro_batches=micro_batches, loss_device=loss_device)[:2], args=(batch,))
        return fn

    @tf.function
    def tape(batch):  # Trainer.train_step's own gradient, with a GradientTape
        features, labels = batch
        with tf.GradientTape() as t:
            loss = trainer.average_loss(trainer.compute_loss(labels, trainer.model(features, training=True)))
        return loss, t.gradient(loss, trainer.model.trainable_variables)

    results = {}
    for name, fn in [("unpipelined", gradients_fn(1)), ("pipelined_4", gradients_fn(4)),
                     ("pipelined_3", gradients_fn(3)), ("tape", tape)]:
        loss, grads = fn(batch)
        results[name] = (float(loss), [tf.convert_to_tensor(g).numpy() for g in grads])
    ref_loss, ref = results["unpipelined"]
    report = {"allclose": {}, "max_abs_diff": {}, "num_gradients": len(ref)}
    # The run's state lives in the runtime; the gin config keeps only its settings.
    report["runtime_devices"] = [placement_lib.short_device(d) for d in runtime.devices]
    report["config_unchanged"] = vars(config) == config_settings
    report["step_before_model"] = step_before_model
    for name, (loss, grads) in results.items():
        report["allclose"][name] = bool(np.isclose(loss, ref_loss, rtol=1e-6) and len(grads) == len(ref) and all(
            np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, ref)))
        report["max_abs_diff"][name] = float(max(np.max(np.abs(a - b)) for a, b in zip(grads, ref)))

    # The backward pass runs across devices: each gradient MatMul is colocated with its forward op.
    graph = gradients_fn(4).get_concrete_function(batch).graph
    def device_of(op):
        if op.device:
            return op.device
        for group in op.colocation_groups():
            other = graph.get_operation_by_name(group.decode()[len("loc:@"):])
            if other.device:
                return other.device
        return ""
    backward = {}
    for op in graph.get_operations():
        if "gradients" in op.name and op.type in ("MatMul", "BatchMatMulV2", "Einsum"):
            device = placement_lib.short_device(device_of(op))
            backward[device] = backward.get(device, 0) + 1
    report["backward_matmul_devices"] = backward
    print("RESULT " + json.dumps(report))
""")


@pytest.mark.timeout(300)
def test_pipelined_gradients_equal_unpipelined_and_backward_runs_on_each_stage(corpus):
    result = clusterlib.run([clusterlib.PYTHON, "-c", GRADIENTS_SCRIPT, corpus], timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-5000:]
    report = script_result(result.stdout)
    # 4 micro-batches, 3 of unequal size (8 = 3 + 3 + 2), and Trainer.train_step's tape: one gradient.
    assert report["allclose"] == {
        "unpipelined": True,
        "pipelined_4": True,
        "pipelined_3": True,
        "tape": True,
    }, report
    # embed (CPU:0) has no MatMul; block_0, block_1 and head run their backward on their own devices.
    assert set(report["backward_matmul_devices"]) == {"CPU:1", "CPU:2", "CPU:3"}, report
    # The runtime was built with its devices; the gin config was not written to.
    assert report["runtime_devices"] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"], report
    assert report["config_unchanged"], report
    assert "build the trainer's state" in report["step_before_model"], report


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_multi_worker_mirrored_workers_each_hold_one_model_parallel_replica(corpus, tmp_path):
    """tfdist-launch --num_workers=2: each worker is one replica whose layers span its 2 logical CPUs."""
    model_dir = str(tmp_path / "model")
    args = lm_args(
        corpus,
        model_dir,
        f"model_parallel.plan={PLAN_2}",
        "model_parallel.num_micro_batches=2",
        "model_parallel.data_parallel='multi_worker_mirrored'",
    )
    result = clusterlib.run(clusterlib.launch_cmd(["--num_workers=2"], args), timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-8000:]
    assert "strategy model_parallel with 2 replica(s) in sync" in result.stdout
    # The chief (worker 0) writes the placement: its layers sit on its own CPU:0 and CPU:1.
    placement = load_placement(model_dir)
    assert_placed(placement, {layer: f"worker:0/{device}" for layer, device in EXPECTED_2.items()})
    assert placement["data_parallel"] == "multi_worker_mirrored"
    # Gradients were all-reduced: both workers end with the same weights.
    fingerprints = re.findall(r"^\[(worker:\d)\].*weights fingerprint (\w+)", result.stdout, re.M)
    assert len(fingerprints) == 2 and fingerprints[0][1] == fingerprints[1][1], fingerprints
    losses = train_losses(model_dir)
    assert len(losses) == 2 and losses[1] < losses[0]
