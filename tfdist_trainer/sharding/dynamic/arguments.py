"""A `DynamicEmbedding`'s arguments checked when the layer is made: one sentence per mistake.

Why at construction and not at the first call: a wrong argument found in a traced step reaches
the user inside Keras' call wrapper and TensorFlow's tracebacks; found here it is a
`ConfigError` (exit 2) naming the layer and the argument, before any cluster work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding.dynamic.keys import KEY_DTYPES

#: Initializers that can draw any number of rows at run time (an evicted row is drawn anew).
INITIALIZERS = (
    keras.initializers.RandomUniform,
    keras.initializers.RandomNormal,
    keras.initializers.TruncatedNormal,
    keras.initializers.Zeros,
    keras.initializers.Ones,
    keras.initializers.Constant,
)


def positive_int(value: Any) -> bool:
    """Whether `value` is an integer >= 1 (numpy integers too; not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def check_arguments(
    name: str,
    *,
    output_dim: Any,
    capacity: Any,
    num_shards: Any,
    key_dtype: str | Sequence[str],
    min_count: Any,
    max_age_steps: Any,
    embeddings_initializer: Any,
    stacked_features: Any,
) -> keras.initializers.Initializer:
    """Raises the ConfigError for the first wrong argument; returns the initializer object."""
    if not positive_int(output_dim):
        raise ConfigError(f"{name}: output_dim must be an integer >= 1, got {output_dim!r}.")
    if not positive_int(capacity):
        raise ConfigError(
            f"{name}: capacity (rows of the table) must be an integer >= 1, got {capacity!r}."
        )
    if not positive_int(min_count):
        raise ConfigError(f"{name}: min_count must be an integer >= 1, got {min_count!r}.")
    if max_age_steps is not None and not positive_int(max_age_steps):
        raise ConfigError(
            f"{name}: max_age_steps must be None or an integer >= 1, got {max_age_steps!r}."
        )
    if num_shards is not None and not positive_int(num_shards):
        raise ConfigError(
            f"{name}: num_shards must be None or an integer >= 1, got {num_shards!r}."
        )
    if stacked_features is not None and not positive_int(stacked_features):
        raise ConfigError(
            f"{name}: stacked_features must be None or an integer >= 1, got {stacked_features!r}."
        )
    _check_key_dtype(name, key_dtype, stacked_features)
    initializer = keras.initializers.get(embeddings_initializer)
    if type(initializer) not in INITIALIZERS:
        raise ConfigError(
            f"{name}: embeddings_initializer must be one of "
            f"{', '.join(c.__name__ for c in INITIALIZERS)} (evicted rows are drawn anew), "
            f"got {type(initializer).__name__}."
        )
    return initializer


def _check_key_dtype(name: str, key_dtype: str | Sequence[str], stacked_features: Any) -> None:
    """'int64' or 'string', or one of them per stacked feature."""
    per_feature = isinstance(key_dtype, (list, tuple))
    if per_feature and (
        stacked_features is None
        or len(key_dtype) != stacked_features
        or any(d not in KEY_DTYPES for d in key_dtype)
    ):
        raise ConfigError(
            f"{name}: a key_dtype per feature needs stacked_features and one of 'int64' "
            f"or 'string' for each of them, got key_dtype={list(key_dtype)!r} with "
            f"stacked_features={stacked_features!r}."
        )
    if not per_feature and key_dtype not in KEY_DTYPES:
        raise ConfigError(
            f"{name}: key_dtype must be 'int64' or 'string' (or, with stacked_features, "
            f"a list of them, one per feature), got {key_dtype!r}."
        )
