"""Optimizer knobs with their arithmetic checked under every strategy, through the CLI.

`train.gradient_accumulation_steps`:
From the same initial weights (train.seed), 2 updates with k = 4 accumulated batches of a global
batch B must leave the same weights as 2 updates with one batch of 4B, to float tolerance: the
same examples (read in order, not shuffled) enter each update, each batch's loss is a share of
the global mean, and the summed gradients are divided by k. Under one_device, mirrored (2
logical CPUs), multi_worker_mirrored (2 workers), parameter_server (1 worker, so both runs
read the same worker's data) and model_parallel (2 devices, each batch pipelined over 2
micro-batches: the two compose). Also: Keras' own optimizer accumulation is refused, and
k < 1 is one sentence.

EMA (`use_ema` on the optimizer): the checkpoint keeps the raw weights and the averages, the
export holds the averages, a resumed run continues as an uninterrupted one, and both the chief's
inline evaluation and the evaluator side-car record the averaged weights' loss (computed here in
numpy). BatchNormalization statistics: replicas end equal under mirrored and multi_worker_mirrored.

Clipping (`global_clipnorm` on the optimizer) is computed over the global batch: 2 clipped
steps under mirrored (2 logical CPUs) and multi_worker_mirrored (2 workers) leave the
weights one_device leaves on the same global batch (Keras alone clips each replica's share).
"""

from __future__ import annotations

import os
import re
import textwrap

import clusterlib
import numpy as np
import pytest
from clusterlib import assert_one_error_line, launch_cmd, strategy_gin, train_cmd

TRAINER = textwrap.dedent('''
    """A small regression model on fixed, unshuffled data: the same examples in the same order."""
    import gin
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist_trainer import Trainer, shard


    @gin.configurable
    class AccumulationTrainer(Trainer):
        def __init__(
            self, *, keras_accumulation=None, global_clipnorm=None, use_ema=False, one_batch=False,
            batch_norm=False, **kwargs,
        ):
            super().__init__(**kwargs)
            self.batch_norm = batch_norm
            self.one_batch = one_batch  # every step the same examples: a resumed run reads what the
            # uninterrupted one reads (the input position is not checkpointed)
            self.keras_accumulation = keras_accumulation
            self.global_clipnorm = global_clipnorm
            self.use_ema = use_ema

        def build_model(self):
            norm = [keras.layers.BatchNormalization()] if self.batch_norm else []
            return keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), *norm, keras.layers.Dense(1)]
            )

        def build_optimizer(self):
            return keras.optimizers.SGD(
                0.1,
                gradient_accumulation_steps=self.keras_accumulation,
                global_clipnorm=self.global_clipnorm,
                use_ema=self.use_ema,
                ema_momentum=0.9,
            )

        def examples(self):
            x = np.random.default_rng(0).normal(size=(4096, 8)).astype("float32")
            return tf.data.Dataset.from_tensor_slices((x, np.sin(x).sum(axis=1, keepdims=True)))

        def build_train_dataset(self, input_context):
            examples = self.examples().take(self.global_batch_size) if self.one_batch else self.examples()
            data = shard(examples, input_context)
            return data.repeat().batch(self.per_replica_batch_size(input_context), drop_remainder=True)

        def build_eval_dataset(self, input_context):
            return self.examples().take(256).batch(64)

        def compute_loss(self, labels, predictions):
            return keras.ops.mean(keras.ops.square(labels - predictions), axis=-1)
''')

BATCH, K, UPDATES = 8, 4, 2


@pytest.fixture(scope="module")
def trainer_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trainer")
    (path / "accumulation_trainer.py").write_text(TRAINER)
    return str(path)


def env(trainer_dir: str) -> dict[str, str]:
    base = clusterlib.base_env()
    return clusterlib.base_env({"PYTHONPATH": os.pathsep.join([trainer_dir, base["PYTHONPATH"]])})


def args(model_dir: str, strategy: str, *bindings: str) -> list[str]:
    return [
        "--module=accumulation_trainer",
        strategy_gin(strategy),
        *[
            f"--gin_bindings={b}"
            for b in (
                "train.trainer_cls=@AccumulationTrainer",
                f"train.train_steps={UPDATES}",
                "train.steps_per_loop=1",
                "train.log_every_n_steps=1",
                "train.checkpoint_every_n_steps=None",
                "train.seed=5",
                *bindings,
            )
        ],
        f"--model_dir={model_dir}",
    ]


def run(trainer_dir: str, model_dir: str, strategy: str, *bindings: str):
    launched = strategy in ("multi_worker_mirrored", "parameter_server")
    task_args = args(model_dir, strategy, *bindings)
    cmd = (
        launch_cmd(
            ["--num_workers=1" if strategy == "parameter_server" else "--num_workers=2"], task_args
        )
        if launched
        else train_cmd(*task_args)
    )
    return clusterlib.run(cmd, env=env(trainer_dir), timeout=300)


def weights(model_dir: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    # Every float tensor of the final checkpoint (the model's weights, SGD's learning rate): keys
    # follow the first object-graph path to a variable, the same in both runs of one strategy.
    reader = tf.train.load_checkpoint(model_dir)
    found = {
        n: reader.get_tensor(n)
        for n, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating
    }
    assert sum(v.size for v in found.values()) > 8 * 16, found.keys()  # the model is in there
    return found


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "strategy, extra",
    [
        ("one_device", ()),
        ("mirrored", ()),
        ("multi_worker_mirrored", ()),
        ("parameter_server", ()),
        ("model_parallel", ("model_parallel.num_micro_batches=2",)),
    ],
)
def test_k_accumulated_batches_update_like_one_batch_k_times_larger(
    trainer_dir, tmp_path, strategy, extra
):
    accumulated = run(
        trainer_dir,
        str(tmp_path / "accumulated"),
        strategy,
        f"Trainer.global_batch_size={BATCH}",
        f"train.gradient_accumulation_steps={K}",
        *extra,
    )
    assert accumulated.returncode == 0, accumulated.stdout[-6000:]
    assert f"step {UPDATES}/{UPDATES} (x{K} batches)" in accumulated.stdout
    whole = run(
        trainer_dir,
        str(tmp_path / "whole"),
        strategy,
        f"Trainer.global_batch_size={BATCH * K}",
        *extra,
    )
    assert whole.returncode == 0, whole.stdout[-6000:]
    a, b = weights(str(tmp_path / "accumulated")), weights(str(tmp_path / "whole"))
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
    records = [
        r for r in clusterlib.read_records(str(tmp_path / "accumulated")) if r["kind"] == "train"
    ]
    assert [r["step"] for r in records] == list(range(1, UPDATES + 1))
    assert records[0]["learning_rate"] == pytest.approx(0.1)


CLIPPED = ("AccumulationTrainer.global_clipnorm=0.05", f"Trainer.global_batch_size={BATCH * K}")


@pytest.fixture(scope="module")
def clipped_one_device(trainer_dir, tmp_path_factory) -> str:
    """The one_device run both clipping tests compare with (the same command for both: one run)."""
    model_dir = str(tmp_path_factory.mktemp("clipped") / "one_device")
    reference = run(trainer_dir, model_dir, "one_device", *CLIPPED)
    assert reference.returncode == 0, reference.stdout[-6000:]
    return model_dir


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker_mirrored"])
def test_global_clipnorm_clips_the_global_batch_as_one_device_does(
    trainer_dir, clipped_one_device, tmp_path, strategy
):
    replicated = run(trainer_dir, str(tmp_path / strategy), strategy, *CLIPPED)
    assert replicated.returncode == 0, replicated.stdout[-6000:]
    a, b = weights(clipped_one_device), weights(str(tmp_path / strategy))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The progress records carry the global gradient norm before clipping: the same number.
    norms = [
        [r["gradient_norm"] for r in clusterlib.read_records(d) if r["kind"] == "train"]
        for d in (clipped_one_device, str(tmp_path / strategy))
    ]
    assert len(norms[0]) == UPDATES and norms[0] == pytest.approx(norms[1], rel=1e-4), norms
    assert min(norms[0]) > 0.05  # above global_clipnorm: clipping was active


def ema_run(trainer_dir: str, model_dir: str, steps: int):
    result = run(
        trainer_dir,
        model_dir,
        "one_device",
        "AccumulationTrainer.use_ema=True",
        "AccumulationTrainer.one_batch=True",
        f"train.train_steps={steps}",
        "train.eval_every_n_steps=10",  # inline evaluations swap the averages in, then out
        "train.extra_hooks=[@ExportSavedModel()]",
    )
    assert result.returncode == 0, result.stdout[-6000:]
    return result


EMA_STEPS = 20


@pytest.fixture(scope="module")
def ema_whole(trainer_dir, tmp_path_factory) -> str:
    """One uninterrupted EMA run (one_device, inline evaluations at steps 10 and 20, exported at
    the end): the EMA test reads its checkpoint and export, the inline-evaluation test its eval
    records (the same command for both: one run)."""
    whole = str(tmp_path_factory.mktemp("ema") / "whole")
    ema_run(trainer_dir, whole, EMA_STEPS)
    return whole


def test_ema_weights_are_evaluated_and_exported_and_training_resumes_from_the_raw_ones(
    trainer_dir, ema_whole, tmp_path
):
    import tensorflow as tf

    whole = ema_whole
    reader = tf.train.load_checkpoint(whole)
    shapes = reader.get_variable_to_shape_map()

    def listed(prefix):  # keys of one tracked list, in list order, tensors only
        found = [k for k in shapes if k.startswith(prefix) and shapes[k]]
        return sorted(found, key=lambda k: int(k[len(prefix) :].split("/")[0]))

    raw = listed("optimizer/_trainable_variables/")
    # SGD keeps no slots: its only non-scalar variables are the averages, in the model's order.
    averages = listed("optimizer/_variables/")
    assert len(averages) == len(raw) == 4, shapes
    assert [shapes[k] for k in averages] == [shapes[k] for k in raw]
    # The checkpoint keeps the raw weights: the swap for each evaluation was undone.
    assert not np.allclose(reader.get_tensor(raw[0]), reader.get_tensor(averages[0]))
    # The export holds the averages (the model's trainable variables in order: kernel, bias x 2).
    exported = tf.saved_model.load(os.path.join(whole, "export", "20"))
    by_shape = {tuple(v.shape): v.numpy() for v in exported.variables}
    for key in averages:
        average = reader.get_tensor(key)
        np.testing.assert_allclose(by_shape[average.shape], average, rtol=1e-6, err_msg=key)
    # Stopped at step 10 and resumed: the same raw weights and averages as the uninterrupted run.
    resumed = str(tmp_path / "resumed")
    ema_run(trainer_dir, resumed, 10)
    ema_run(trainer_dir, resumed, 20)
    a, b = weights(whole), weights(resumed)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def eval_loss_of(weights: list[np.ndarray]) -> float:
    """The trainer's eval loss, in numpy, of Dense(16, tanh) -> Dense(1) holding `weights`."""
    x = np.random.default_rng(0).normal(size=(4096, 8)).astype("float32")[:256]
    y = np.sin(x).sum(axis=1, keepdims=True)
    kernel0, bias0, kernel1, bias1 = weights
    predictions = np.tanh(x @ kernel0 + bias0) @ kernel1 + bias1
    return float(np.mean(np.square(y - predictions)))


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("evaluated_by", ["chief", "evaluator"])
def test_evaluations_inline_and_by_the_side_car_use_the_averages(
    trainer_dir, tmp_path, evaluated_by, request
):
    """The chief's inline evaluation and the evaluator side-car (which takes over evaluation when
    there is one) evaluate the optimizer's averages: the loss they record is the averaged
    weights' loss, computed here in numpy from the checkpoint, not the raw weights'.

    The chief's: the EMA test's uninterrupted run (inline evaluations at steps 10 and 20, its
    final checkpoint at 20), read here; the side-car's: a run of its own."""
    import tensorflow as tf

    steps = EMA_STEPS
    if evaluated_by == "chief":
        model_dir, evaluated_at = request.getfixturevalue("ema_whole"), [10, steps]
    else:
        model_dir, evaluated_at = str(tmp_path / "m"), [steps]
        task_args = args(
            model_dir,
            "one_device",
            "AccumulationTrainer.use_ema=True",
            "AccumulationTrainer.one_batch=True",
            f"train.train_steps={steps}",
            f"train.eval_every_n_steps={steps}",
            f"train.checkpoint_every_n_steps={steps}",
        )
        result = clusterlib.run(
            launch_cmd(["--evaluator"], task_args), env=env(trainer_dir), timeout=300
        )
        assert result.returncode == 0, result.stdout[-6000:]
    reader = tf.train.load_checkpoint(model_dir)
    shapes = reader.get_variable_to_shape_map()

    def listed(prefix):  # one tracked list's tensors, in list order (the model's weights' order)
        keys = [k for k in shapes if k.startswith(prefix) and shapes[k]]
        keys.sort(key=lambda k: int(k[len(prefix) :].split("/")[0]))
        return [reader.get_tensor(k) for k in keys]

    averaged = eval_loss_of(listed("optimizer/_variables/"))
    raw = eval_loss_of(listed("optimizer/_trainable_variables/"))
    assert abs(averaged - raw) > 1e-3 * raw, (averaged, raw)  # the two are told apart
    evals = [r for r in clusterlib.read_records(model_dir) if r["kind"] == "eval"]
    assert [(r["step"], r["evaluated_by"]) for r in evals] == [
        (step, evaluated_by) for step in evaluated_at
    ], evals
    assert evals[-1]["eval_loss"] == pytest.approx(averaged, rel=1e-4), (evals[-1], raw)


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker_mirrored"])
def test_replicas_agree_on_batch_norm_statistics(trainer_dir, tmp_path, strategy):
    """Each replica's BatchNormalization statistics come from its own batches; averaged after
    every loop, the replicas (mirrored's 2 devices, or 2 workers) end with identical weights,
    and the end of the run says so. Without the averaging, both say they differ."""
    result = run(
        trainer_dir,
        str(tmp_path / "m"),
        strategy,
        "AccumulationTrainer.batch_norm=True",
        f"Trainer.global_batch_size={BATCH * K}",
        "train.train_steps=20",
        "train.steps_per_loop=5",
    )
    assert result.returncode == 0, result.stdout[-6000:]
    assert "hold different values" not in result.stdout, result.stdout[-4000:]
    if strategy == "mirrored":
        assert "every replica on this task holds the same weights (2 replicas)" in result.stdout
        return
    fingerprints = re.findall(r"^\[(worker:\d)\].*weights fingerprint (\w+)", result.stdout, re.M)
    assert len(fingerprints) == 2 and fingerprints[0][1] == fingerprints[1][1], fingerprints
    assert (
        f"every worker holds the same weights (fingerprint {fingerprints[0][1]})" in result.stdout
    )


def test_keras_optimizer_accumulation_is_refused_in_one_sentence(trainer_dir, tmp_path):
    result = clusterlib.run(
        train_cmd(
            *args(str(tmp_path / "m"), "one_device", "AccumulationTrainer.keras_accumulation=4")
        ),
        env=env(trainer_dir),
        timeout=300,
    )
    assert_one_error_line(
        result,
        2,
        "returns an optimizer with gradient_accumulation_steps=4",
        "set train.gradient_accumulation_steps = 4 instead",
    )


def test_fewer_than_one_batch_per_update_is_one_sentence(trainer_dir, tmp_path):
    result = clusterlib.run(
        train_cmd(*args(str(tmp_path / "m"), "one_device", "train.gradient_accumulation_steps=0")),
        env=env(trainer_dir),
        timeout=300,
    )
    assert_one_error_line(result, 2, "train.gradient_accumulation_steps must be a positive integer")
