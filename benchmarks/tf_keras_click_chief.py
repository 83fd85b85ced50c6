"""The tf-keras 2 chief of benchmarks/click_vs_tf_keras.py: the click model as a tf-keras user
builds it today, Keras `Embedding` tables sharded by TF's `variable_partitioner`.

    .venv-tfkeras/bin/python benchmarks/tf_keras_click_chief.py SPEC.json    (TF_CONFIG: the chief)

Imports only TensorFlow, tf_keras, numpy and benchmarks/socket_bytes.py (standard library): never
keras 3 or tfdist_trainer. The sharded-embedding recipe's wide & deep model, layer for layer:
per feature an `Embedding(vocab, 1 + dim)` whose first column is the wide weight; a dense linear
term and bottom layer; the MLP over the deep columns; Adagrad, binary cross-entropy from logits,
AUC. The strategy is `ParameterServerStrategy(variable_partitioner=MinSizePartitioner(...,
max_shards=num_ps))`, TF's documented way to shard large variables over the ps. The pool the
parent wrote (.npz) through a DatasetCreator; ``fit(steps_per_epoch=steps_per_call)``. The first
warmup_steps / steps_per_call epochs are untimed; the bytes the ps connections carried are read
at the timed epochs' edges. Prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from process_cpu import cluster_cpu, per_step_ms
from socket_bytes import per_step, ps_traffic
from tf_keras_ps_chief import print_result, wait_for_servers, what_ran


def build_model(tf_keras, spec: dict):
    """The recipe's ClickTrainer model in tf_keras layers."""
    import tensorflow as tf

    layers, dim = tf_keras.layers, spec["embedding_dim"]
    initializer = tf_keras.initializers.RandomUniform(-0.01, 0.01)
    dense_in = tf_keras.Input((spec["num_dense"],), name="dense")
    categorical_in = tf_keras.Input((len(spec["vocab_sizes"]),), dtype="int64", name="categorical")
    wide = [layers.Dense(1, name="dense_linear")(dense_in)]
    deep = [layers.Dense(dim, activation="relu", name="dense_bottom")(dense_in)]
    for f, vocab in enumerate(spec["vocab_sizes"]):
        ids = layers.Lambda(lambda x, f=f: x[:, f], name=f"ids_{f}")(categorical_in)
        rows = layers.Embedding(
            vocab, 1 + dim, embeddings_initializer=initializer, name=f"table_{f}"
        )(ids)
        # split as the recipe does (one concat in the gradient, not two StridedSliceGrads)
        wide_f, deep_f = layers.Lambda(lambda r: tf.split(r, [1, dim], -1), name=f"split_{f}")(rows)
        wide.append(wide_f)
        deep.append(deep_f)
    x = layers.Concatenate(name="deep_concat")(deep)
    for i, units in enumerate(spec["hidden_units"]):
        x = layers.Dense(units, activation="relu", name=f"mlp_{i}")(x)
    wide.append(layers.Dense(1, name="deep_logit")(x))
    logit = layers.Add(name="logit")(wide)
    return tf_keras.Model({"dense": dense_in, "categorical": categorical_in}, logit)


def main(spec_path: str) -> dict:
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # any tf.keras inside TF resolves to tf_keras
    import numpy as np
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(spec["seed"])
    with np.load(spec["data"]) as data:
        pool = ({"dense": data["dense"], "categorical": data["categorical"]}, data["labels"])
    wait_for_servers(spec["cluster"], spec["startup_timeout_s"])
    t0 = time.perf_counter()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=spec["min_shard_bytes"], max_shards=len(spec["cluster"]["ps"])
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    with strategy.scope():
        model = build_model(tf_keras, spec)
        model.compile(
            optimizer=tf_keras.optimizers.Adagrad(spec["learning_rate"]),
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[tf_keras.metrics.AUC(from_logits=True, name="auc")],
            steps_per_execution=spec["steps_per_execution"],
        )

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(spec["batch_size"])
        # batched once, then the batches repeat (as the Trainer's chief reads the pool)
        return (
            tf.data.Dataset.from_tensor_slices(pool)
            .batch(batch, drop_remainder=True)
            .cache()
            .repeat()
            .prefetch(tf.data.AUTOTUNE)
        )

    per_epoch = spec["steps_per_call"]
    warm, timed = spec["warmup_steps"] // per_epoch, spec["steps"] // per_epoch
    begin, ends, traffic, cpu = [], [], [], []

    def epoch_end(epoch, logs):
        ends.append(time.perf_counter())
        if epoch + 1 in (warm, warm + timed):
            traffic.append(ps_traffic(spec["cluster"]["ps"]))
            cpu.append(cluster_cpu(spec["cluster"]))

    clock = tf_keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: begin.append(time.perf_counter()), on_epoch_end=epoch_end
    )
    history = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        steps_per_epoch=per_epoch,
        epochs=warm + timed,
        verbose=0,
        callbacks=[clock],
    )
    losses = history.history["loss"]
    tables = [v for v in model.variables if "table_" in v.name]
    return {
        "timed_s": ends[-1] - ends[warm - 1],
        "build_s": begin[0] - t0,  # strategy, model, compile and fit's set-up
        "warmup_s": ends[warm - 1] - begin[0],
        "warmup_loss": float(losses[warm - 1]),
        "final_loss": float(losses[-1]),
        "auc": float(history.history["auc"][-1]),
        "bytes_per_step": per_step(traffic[0], traffic[1], spec["steps"]),
        "cpu_ms_per_step": per_step_ms(cpu[0], cpu[1], spec["steps"]),
        "steps_per_execution": spec["steps_per_execution"],
        "steps_counted": int(model._train_counter.numpy()),
        "expected_steps": (warm + timed) * per_epoch,
        "table_shards": len(tables),
        "variable_devices": sorted({v.device for v in model.variables}),
        **what_ran(tf, tf_keras),
    }


if __name__ == "__main__":
    print_result(main(sys.argv[1]))
