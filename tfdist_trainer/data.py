"""Input helpers: how a Trainer's dataset is split over workers and replicas."""

from __future__ import annotations

import tensorflow as tf


def shard(dataset: tf.data.Dataset, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Keeps this input pipeline's share of `dataset`, so workers do not train on the same examples.

    Shard before shuffling and batching; a no-op with a single pipeline.
    """
    if input_context.num_input_pipelines > 1:
        return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset


def finish(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The runner's last touch on every pipeline: prefetch so input overlaps the step."""
    return dataset.prefetch(tf.data.AUTOTUNE)


def single_pipeline_context() -> tf.distribute.InputContext:
    """The context for data read whole by one process (evaluation, the evaluator side-car)."""
    return tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
