"""Input helpers: how a Trainer's dataset is split over workers and replicas."""

from __future__ import annotations

import tensorflow as tf


def shard(dataset: tf.data.Dataset, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Keeps this input pipeline's share of `dataset`, so workers do not train on the same examples.

    Shard before shuffling and batching; a no-op with a single pipeline. Under
    parameter_server the pipeline id is a tensor (the worker's index), so
    compare it with TF ops, not Python `if`.
    """
    if input_context.num_input_pipelines > 1:
        return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset


def finish(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The runner's last touch on every pipeline: prefetch so input overlaps the step."""
    return dataset.prefetch(tf.data.AUTOTUNE)


def worker_input_context(num_workers: int) -> tf.distribute.InputContext:
    """The context of one parameter_server worker's pipeline; call it inside a per-worker dataset function.

    Each worker is one input pipeline and its steps are its own (one replica,
    no synchronization), so `shard()` gives worker i the i-th of `num_workers`
    disjoint shares. `input_pipeline_id` is a scalar int64 tensor, bound to the
    worker's index when the dataset is created on that worker.
    """
    index = tf.distribute.coordinator.experimental_get_current_worker_index()
    return tf.distribute.InputContext(num_input_pipelines=num_workers, input_pipeline_id=index,
                                      num_replicas_in_sync=1)


def single_pipeline_context() -> tf.distribute.InputContext:
    """The context for data read whole by one process (evaluation, the evaluator side-car)."""
    return tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
