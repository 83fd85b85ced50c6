"""The model zoo: real-shape models trained by the CLI under every strategy.

Tiny models prove the plumbing; some TensorFlow failures appear only at real
sizes (Grappler's MemoryOptimizer rewrites a loop's AddN nodes once a graph's
estimated memory is large, issue 20). Every strategy (one_device, mirrored,
multi_worker_mirrored, parameter_server, model_parallel) trains several models of
the zoo (configs/zoo/), and across the models every strategy meets steps_per_loop
1, 10 and 'auto' (a Latin square: model i under strategy j gets
STEPS_PER_LOOP[(i + j) % 3]), so the Transformer LM meets 10 under one_device, the
case that crashed. RUNS names the (model, strategy) cells the zoo's tests run;
tests/test_zoo_transformer_lm.py checks that they still cover the square.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import clusterlib
from clusterlib import REPO, launch_cmd, read_records, strategy_gin

from tfdist_trainer.plan.strategies import NAMES

# keras_hub_*: models nobody here wrote (recipes/keras_hub: keras-hub's GPT-2 causal LM with its
# tied head, and a BERT classifier, built from config), 2 blocks of width 128.
# keras_rs_dlrm: a DLRM / DCN-v2 written with keras-rs, its tables through sharding.from_keras_rs.
MODELS = (
    "transformer_lm",
    "resnet_cnn",
    "wide_deep",
    "keras_hub_gpt2",
    "keras_hub_bert",
    "keras_rs_dlrm",
)
STRATEGIES = NAMES  # every strategy
STEPS_PER_LOOP = ("10", "'auto'", "1")
TRAIN_STEPS = 30  # configs/zoo/*.gin: three progress records (every 10 steps)
# One zoo run in bfloat16 compute: BatchNorm and convolutions under mixed precision.
MIXED_BFLOAT16 = ("resnet_cnn", "one_device")
# One zoo run reads its data through the tf.data service: its loop (the one that stops when a
# finite dataset ends) meets a real-shape model, at steps_per_loop 10.
DATA_SERVICE = ("transformer_lm", "parameter_server")
# The cells the zoo's tests run (each a launched job of 4-5 processes, 25-160 s under load). A
# cell left out repeats what others hold: the same strategy at the same steps_per_loop on another
# real-shape model. Kept: every strategy at 1, 10 and 'auto' (checked by
# test_zoo_transformer_lm.py), the Transformer LM at 10 under one_device (issue 20), the two
# cells above, keras-hub's models under both splitting strategies and every strategy on one of
# them, resnet_cnn's pipelined BatchNorm and wide_deep's own train_step under model_parallel.
# keras_hub_gpt2 under parameter_server: its everyday-knobs test; keras_rs_dlrm under
# parameter_server: its 2-ps test. Left out, with where its (strategy, steps_per_loop) lives:
# transformer_lm mirrored/'auto' (keras_hub_gpt2), multi_worker_mirrored/1 (keras_hub_gpt2),
# model_parallel/'auto' (keras_hub_gpt2); resnet_cnn parameter_server/'auto' (keras_hub_bert);
# wide_deep one_device/1 (keras_rs_dlrm); keras_hub_gpt2 one_device/10 (transformer_lm);
# keras_rs_dlrm mirrored/10 and multi_worker_mirrored/'auto' (wide_deep).
RUNS = {
    "transformer_lm": ("one_device", "parameter_server"),
    "resnet_cnn": ("one_device", "mirrored", "multi_worker_mirrored", "model_parallel"),
    "wide_deep": ("mirrored", "multi_worker_mirrored", "parameter_server", "model_parallel"),
    "keras_hub_gpt2": ("mirrored", "multi_worker_mirrored", "parameter_server", "model_parallel"),
    "keras_hub_bert": ("parameter_server", "model_parallel"),
    # multi_worker_mirrored: the keras-rs bridge where a plain table would be read whole each step.
    "keras_rs_dlrm": ("one_device", "multi_worker_mirrored", "parameter_server", "model_parallel"),
}


def strategies(model: str, but: Sequence[str] = ()) -> list[str]:
    """The strategies the zoo trains `model` under (RUNS), less `but` (those its own tests run)."""
    return [s for s in RUNS[model] if s not in but]


def steps_per_loop(model: str, strategy: str) -> str:
    return STEPS_PER_LOOP[(MODELS.index(model) + STRATEGIES.index(strategy)) % 3]


def bindings(model: str, strategy: str) -> list[str]:
    extra = [f"train.steps_per_loop={steps_per_loop(model, strategy)}"]
    if strategy == "model_parallel":
        # Pipelined over 2 micro-batches (the keras-hub models 4), except the wide & deep model:
        # its Trainer brings its own train_step (sparse table updates), which pipelining would
        # replace (a ConfigError).
        micro_batches = {"wide_deep": 1, "keras_hub_gpt2": 4, "keras_hub_bert": 4}.get(model, 2)
        extra.append(f"model_parallel.num_micro_batches={micro_batches}")
    if (model, strategy) == MIXED_BFLOAT16:
        # bfloat16 on a CPU without native support is emulated (~4x slower than float32): at
        # 16x16 images the run costs what a float32 one does (200 s -> ~60 s in make test), and
        # BatchNorm and every convolution still run in bfloat16.
        extra.append("train.mixed_precision='mixed_bfloat16'")
        extra.append("ResNetTrainer.image_size=16")
    if (model, strategy) == DATA_SERVICE:
        extra.append("parameter_server.data_service=True")
    return [f"--gin_bindings={b}" for b in extra]


def train_and_check(
    model: str,
    strategy: str,
    model_dir: str,
    extra: Sequence[str] = (),
    cluster: Sequence[str] = ("--num_workers=2", "--num_ps=1"),
) -> None:
    """Trains `model` under `strategy` as a user would (tfdist-launch) and checks the run.

    `extra`: more gin bindings (the knobs a test adds to the zoo's settings);
    `cluster`: tfdist-launch's task counts.

    Exit 0, exactly TRAIN_STEPS steps, a finite loss that falls, and the peak
    memory of the task in every progress record.
    """
    result = clusterlib.run(
        launch_cmd(
            list(cluster),
            [
                f"--gin_file={REPO}/configs/zoo/{model}.gin",
                strategy_gin(strategy),
                *bindings(model, strategy),
                *[f"--gin_bindings={b}" for b in extra],
                f"--model_dir={model_dir}",
            ],
        ),
        timeout=420,
    )
    where = f"{model} under {strategy} ({' '.join([*bindings(model, strategy), *extra])})"
    assert result.returncode == 0, f"{where}:\n{result.stdout[-6000:]}"
    train = [r for r in read_records(model_dir) if r["kind"] == "train"]
    assert train and train[-1]["step"] == TRAIN_STEPS, (where, train)
    losses = [r["loss"] for r in train]
    assert all(math.isfinite(loss) for loss in losses), (where, losses)
    assert losses[-1] < losses[0], (where, losses)
    assert all(r["peak_rss_mib"] > 0 for r in train), (where, train)
    assert "peak_rss=" in result.stdout, result.stdout[-3000:]
    assert clusterlib.no_process_left(model_dir) == []
    if strategy == "model_parallel":
        check_model_parallel(model, model_dir, result.stdout)
    return result.stdout


def check_model_parallel(model: str, model_dir: str, output: str) -> None:
    """'auto' on 2 devices splits a keras-hub backbone evenly; pipelined BatchNorm is said once."""
    with open(os.path.join(model_dir, "placement.json")) as f:
        placement = json.load(f)
    if model.startswith("keras_hub"):
        shares = [d["bytes"] for d in placement["per_device"]]
        assert all(0.4 <= b / sum(shares) <= 0.6 for b in shares), (model, shares)
        assert placement["misplaced"] == [] and placement["warnings"] == [], placement
    if model == "resnet_cnn":  # pipelined with BatchNormalization: statistics per micro-batch
        assert output.count("each micro-batch is normalised with its own statistics") == 1, output
