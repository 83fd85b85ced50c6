"""The tf-keras 2 chief of benchmarks/ps_vs_tf_keras.py: `model.fit` under ParameterServerStrategy.

    .venv-tfkeras/bin/python benchmarks/tf_keras_ps_chief.py SPEC.json      (TF_CONFIG: the chief)

Imports only TensorFlow, tf_keras and numpy (never keras 3 or tfdist_trainer): what a tf-keras
user runs today. The MNIST recipe's CNN in tf_keras layers, Adam, sparse cross-entropy, accuracy;
the pool the parent wrote (.npz) through a DatasetCreator (normalize, cache, repeat, batch,
prefetch); ``fit(steps_per_epoch=steps_per_call)``: each epoch ends with ``coordinator.join()``,
as each ``run.train(steps_per_call)`` of the library. The first warmup_steps / steps_per_call
epochs are untimed. Prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def wait_for_servers(cluster: dict[str, list[str]], timeout_s: float) -> None:
    """Until every ps and worker task listens: the chief starts beside them."""
    pending = [a for task_type in ("ps", "worker") for a in cluster.get(task_type, [])]
    deadline = time.monotonic() + timeout_s
    while pending:
        for address in list(pending):
            host, port = address.rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                pending.remove(address)
            except OSError:
                pass
        if pending and time.monotonic() > deadline:
            raise SystemExit(f"{', '.join(pending)} did not listen within {timeout_s:g}s")
        time.sleep(0.1)


def main(spec_path: str) -> dict:
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # any tf.keras inside TF resolves to tf_keras
    import numpy as np
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(spec["seed"])
    with np.load(spec["data"]) as data:
        images, labels = data["images"], data["labels"]
    wait_for_servers(spec["cluster"], spec["startup_timeout_s"])
    t0 = time.perf_counter()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    (f0, f1), layers = spec["filters"], tf_keras.layers
    with strategy.scope():
        model = tf_keras.Sequential(
            [
                tf_keras.Input((28, 28, 1)),
                layers.Conv2D(f0, 3, activation="relu"),
                layers.MaxPooling2D(),
                layers.Conv2D(f1, 3, activation="relu"),
                layers.MaxPooling2D(),
                layers.Flatten(),
                layers.Dense(spec["dense_units"], activation="relu"),
                layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=tf_keras.optimizers.Adam(spec["learning_rate"]),
            loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            steps_per_execution=spec["steps_per_execution"],
        )

    def dataset_fn(input_context):
        return (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .map(
                lambda x, y: (tf.cast(x, tf.float32) / 255.0, y),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
            .cache()
            .repeat()
            .batch(
                input_context.get_per_replica_batch_size(spec["batch_size"]), drop_remainder=True
            )
            .prefetch(tf.data.AUTOTUNE)
        )

    per_epoch = spec["steps_per_call"]
    warm, timed = spec["warmup_steps"] // per_epoch, spec["steps"] // per_epoch
    begin, ends = [], []
    clock = tf_keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: begin.append(time.perf_counter()),
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()),
    )
    history = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        steps_per_epoch=per_epoch,
        epochs=warm + timed,
        verbose=0,
        callbacks=[clock],
    )
    losses = history.history["loss"]
    return {
        "timed_s": ends[-1] - ends[warm - 1],
        "build_s": begin[0] - t0,  # strategy, model, compile and fit's set-up
        "warmup_s": ends[warm - 1] - begin[0],
        "warmup_loss": float(losses[warm - 1]),
        "final_loss": float(losses[-1]),
        "steps_per_execution": spec["steps_per_execution"],
        "closures_per_call": -(-per_epoch // spec["steps_per_execution"]),
        "steps_counted": int(model._train_counter.numpy()),
        "expected_steps": (warm + timed) * per_epoch,
        "variable_devices": sorted({v.device for v in model.variables}),
        **what_ran(tf, tf_keras),
    }


def what_ran(tf, tf_keras) -> dict:
    """The versions, and that the chief ran tf-keras 2 alone (no keras 3, no tfdist_trainer)."""
    return {
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
        "keras_3_modules_imported": sorted(m for m in sys.modules if m.split(".")[0] == "keras"),
        "tfdist_trainer_imported": "tfdist_trainer" in sys.modules,
    }


def print_result(result: dict) -> None:
    """The ``RESULT`` line the parent reads; then leaves at once."""
    print("RESULT " + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the coordinator's threads can keep a finished chief alive


if __name__ == "__main__":
    print_result(main(sys.argv[1]))
