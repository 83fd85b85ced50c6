"""Each shard's own initializer: what both table kinds draw their shards' first rows from."""

from __future__ import annotations

from typing import Any

import keras


def shard_initializer(initializer: Any, shard: int) -> Any:
    """The initializer of shard `shard`: a draw of its own, so that equal-sized shards differ.

    A Keras 3 random initializer fixes its seed when it is constructed (an
    unseeded one draws one then), so one instance called for every shard gives
    equal-sized shards the same rows, and tables that share an instance (keras-rs'
    default initializer) the same values. An unseeded initializer is therefore
    cloned for every shard (a fresh seed each, from the global seed when one is set);
    a seeded one gets seed + shard (reproducible); others are used as they are.
    """
    initializer = keras.initializers.get(initializer)
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    seed = config.get("seed", "no seed")
    if seed is None:
        return type(initializer).from_config(config)
    if isinstance(seed, int) and not isinstance(seed, bool):
        return type(initializer).from_config({**config, "seed": seed + shard})
    return initializer
