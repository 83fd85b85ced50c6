"""The tf-keras 2 chief of benchmarks/ps_vs_tf_keras.py: `model.fit` under ParameterServerStrategy.

    .venv-tfkeras/bin/python benchmarks/tf_keras_ps_chief.py SPEC.json      (TF_CONFIG: the chief task)

Run by the benchmark with the benchmark-only venv's python (tf-keras
installed there, TensorFlow shared with the project's .venv), as the chief of
a cluster whose ps and worker tasks are the library's own serving processes.
It imports only TensorFlow, tf_keras and numpy -- never keras 3 or
tfdist_trainer -- so the baseline is what a tf-keras user runs today:

- the MNIST recipe's CNN (recipes/mnist/trainer.py MnistTrainer.build_model),
  built with tf_keras layers: Conv2D(f0, 3, relu), MaxPooling2D,
  Conv2D(f1, 3, relu), MaxPooling2D, Flatten, Dense(units, relu), Dense(10);
  Adam(learning_rate), sparse categorical cross-entropy from logits, accuracy;
- compiled and fitted under
  ``tf.distribute.ParameterServerStrategy(TFConfigClusterResolver())`` with no
  variable partitioner (the library's parameter_server shards nothing either);
- data: the benchmark's pool (an .npz the parent wrote, the same arrays the
  library's chief reads) through a `DatasetCreator` giving the pipeline of
  benchmarks/_common.make_dataset: normalize to [0, 1], cache, repeat, batch
  the global batch (drop remainder), prefetch;
- ``model.fit(DatasetCreator, steps_per_epoch=steps_per_call, epochs=E,
  verbose=0)``: each epoch ends with ``coordinator.join()``, as each
  ``loop.train(steps_per_call)`` call of the library does. The first
  ``warmup_steps / steps_per_call`` epochs are the untimed warm-up; the timed
  span runs from the end of the last warm-up epoch to the end of the last
  epoch (all per-epoch overhead included).

Prints one line ``RESULT {json}`` and exits with os._exit (the coordinator's
threads can keep a finished chief alive).
"""

from __future__ import annotations

import json
import os
import sys
import time


def wait_for_servers(cluster: dict[str, list[str]], timeout_s: float) -> None:
    """Until every ps and worker task listens: the benchmark's --smoke starts this chief beside them."""
    import socket

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
    t_import = time.perf_counter()
    import numpy as np
    import tensorflow as tf
    import tf_keras

    import_s = time.perf_counter() - t_import

    tf_keras.utils.set_random_seed(spec["seed"])
    with np.load(spec["data"]) as data:
        images, labels = data["images"], data["labels"]
    wait_for_servers(spec["cluster"], spec["startup_timeout_s"])

    t0 = time.perf_counter()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    global_batch = spec["batch_size"]
    f0, f1 = spec["filters"]
    with strategy.scope():
        layers = tf_keras.layers
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

    def normalize(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = input_context.get_per_replica_batch_size(global_batch)
        return (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
            .cache()
            .repeat()
            .batch(batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    steps_per_epoch = spec["steps_per_call"]
    warmup_epochs = spec["warmup_steps"] // steps_per_epoch
    timed_epochs = spec["steps"] // steps_per_epoch
    train_begin, begins, ends = [], [], []
    clock = tf_keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: train_begin.append(time.perf_counter()),
        on_epoch_begin=lambda epoch, logs: begins.append(time.perf_counter()),
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()),
    )
    history = model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        steps_per_epoch=steps_per_epoch,
        epochs=warmup_epochs + timed_epochs,
        verbose=0,
        callbacks=[clock],
    )
    timed_s = ends[-1] - ends[warmup_epochs - 1]
    # Diagnostics, after the timed span: fit reads its steps_per_execution counter (a tf.Variable created
    # under the strategy scope, so on a ps) on the chief once or twice per scheduled closure.
    t_read = time.perf_counter()
    for _ in range(20):
        model._steps_per_execution.numpy()
    counter_read_ms = (time.perf_counter() - t_read) / 20 * 1e3
    losses = history.history["loss"]
    keras3 = sorted(m for m in sys.modules if m == "keras" or m.startswith("keras."))
    return {
        "variant": spec["variant"],
        "steps": spec["steps"],
        "steps_per_call": steps_per_epoch,
        "steps_per_execution": spec["steps_per_execution"],
        "closures_per_call": -(-steps_per_epoch // spec["steps_per_execution"]),
        "timed_s": timed_s,
        "call_times_s": [e - b for b, e in zip(begins[warmup_epochs:], ends[warmup_epochs:])],
        "import_s": import_s,
        "build_s": train_begin[0]
        - t0,  # strategy, model, compile and fit's set-up (datasets, coordinator)
        "warmup_s": ends[warmup_epochs - 1] - train_begin[0],
        "warmup_steps": warmup_epochs * steps_per_epoch,
        "warmup_loss": float(losses[warmup_epochs - 1]),
        "final_loss": float(losses[-1]),
        "steps_counted": int(model._train_counter.numpy()),
        "expected_steps": (warmup_epochs + timed_epochs) * steps_per_epoch,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "variable_devices": sorted({v.device for v in model.variables}),
        "counter_variable_devices": {
            "steps_per_execution": model._steps_per_execution.device,
            "train_counter": model._train_counter.device,
        },
        "counter_read_ms": counter_read_ms,
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
        "keras_3_modules_imported": keras3[:5],
        "tfdist_trainer_imported": "tfdist_trainer" in sys.modules,
    }


if __name__ == "__main__":
    result = main(sys.argv[1])
    print("RESULT " + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the coordinator's threads can keep a finished chief alive
