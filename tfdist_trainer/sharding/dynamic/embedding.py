"""`DynamicEmbedding`: an embedding table that grows with its keys (no vocabulary size), and its counters.

Why: a `ShardedEmbedding` has a fixed number of rows, so raw ids (64-bit
user ids, Criteo's hex strings) must first be hashed into buckets, and
distinct ids share a row. Here every key gets its own row the first time it
is seen `min_count` times, from a pool of `capacity` rows per shard; when a
shard is full the rows its eviction policy scores lowest are freed (LFU by
default, or LRU: dynamic/eviction.py), and with
`max_age_steps` rows not seen for that long are freed. Keys map to shards by a
stable hash of the key (dynamic/keys.py); each shard's state and its
operations live on one device (dynamic/shard.py): a ps task under
parameter_server, placed bytes-balanced with the other variables. Keys
without a row read one default row of the layer's (not a shard's), so a
checkpoint, which holds keys and not shards (dynamic/checkpoint.py),
restores onto any number of shards with the same lookups for every key.

Only the rows a batch uses cross the network: the lookup happens on the ps,
the layer gathers those rows of the pool, and the pool's gradient is
`tf.IndexedSlices` (`sharding.SGD` and `sharding.SparseAdagrad` update only
those rows; their slot rows are reset with evicted rows).

Many small tables cost little with ``stacked_features``: keys whose last axis
holds one key of each of F features share one table (a key is the pair
(feature, key), dynamic_keys.stacked_keys), with one default row per feature.
A training step then runs one hash-table step per shard, not F: the 26 tables
of the click model are one table's work (table stacking, as TPU embeddings
and TorchRec's fused tables do). The features share the capacity and the LFU
eviction, so rows go to the features whose keys are used most.

Strategies: one_device (or none) and parameter_server. Under mirrored,
multi_worker_mirrored and model_parallel every replica (or device stage)
would need the same key -> row map, so building the layer there is a
ConfigError; so is calling it in an XLA-compiled step (`train.jit_compile`),
which has no kernels for its hash tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.sharding import update_lock
from tfdist_trainer.sharding.dynamic import checkpoint as dynamic_checkpoint
from tfdist_trainer.sharding.dynamic.arguments import check_arguments
from tfdist_trainer.sharding.dynamic.checkpoint import DynamicTableCheckpoint
from tfdist_trainer.sharding.dynamic.eviction import eviction_policy
from tfdist_trainer.sharding.dynamic.keys import (
    as_int64_keys,
    shard_of,
    stacked_keys,
)
from tfdist_trainer.sharding.dynamic.shard import COUNTERS, DynamicTableShard
from tfdist_trainer.sharding.initializers import shard_initializer
from tfdist_trainer.sharding.placement import (
    create_on,
    is_parameter_server,
    placement_ledger,
    ps_devices,
    strategy_gin_name,
    strategy_kind,
)
from tfdist_trainer.sharding.saving import serializable


def _reinitializer(initializer: Any, shard: int) -> Any:
    """`initializer` drawing fresh values at every call (a seed generator of the shard's own)."""
    config = initializer.get_config()
    if "seed" not in config:
        return initializer
    seed = config["seed"]
    seed = seed + 1_000_003 + shard if isinstance(seed, int) else None
    return type(initializer).from_config({**config, "seed": keras.random.SeedGenerator(seed)})


def _refuse_replicas(layer_name: str, strategy: tf.distribute.Strategy) -> None:
    if strategy_kind(strategy) != "replicated":
        return
    raise ConfigError(
        f"{layer_name}: a DynamicEmbedding runs under one_device or parameter_server only, "
        f"not {strategy_gin_name(strategy)} (every replica would need the same key -> row map); "
        f"use parameter_server, or a ShardedEmbedding of fixed size."
    )


def _xla_refusal(names: Sequence[str]) -> ConfigError:
    """The one sentence for dynamic tables in an XLA-compiled step."""
    return ConfigError(
        f"{', '.join(names)}: a DynamicEmbedding cannot run in an XLA-compiled step "
        f"(train.jit_compile=True, or a jit_compile function): XLA has no kernels for its "
        f"key -> row hash tables; set train.jit_compile=False, or use a ShardedEmbedding of "
        f"fixed size."
    )


def refuse_jit_compile(model: keras.layers.Layer) -> None:
    """Raises the ConfigError for `train.jit_compile=True` before the step is traced, where a
    ConfigError still ends the task with exit 2 (raised while tracing, AutoGraph re-raises it
    as a StagingError: a traceback and exit 1)."""
    names = [layer.name for layer in dynamic_tables(model)]
    if names:
        raise _xla_refusal(names)


def _refuse_xla(layer_name: str) -> None:
    """Inside an XLA compile the layer's hash tables fail with TF's own obscure error (an
    InternalError, 'RET_CHECK failure ... variable.var()->is_initialized'): say why instead."""
    if tf_compat.in_xla_compile():
        raise _xla_refusal([layer_name])


def _table_device(device: str | None, strategy: tf.distribute.Strategy) -> str | None:
    """Where a shard's hash tables and critical section go: its ps task, or the CPU of its host."""
    if device is None or is_parameter_server(strategy):
        return device
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type="CPU", device_index=0).to_string()


@serializable
class DynamicEmbedding(tf_compat.ReplacesCheckpointChildren, keras.layers.Layer):
    """An embedding of keys of any value (int64, or strings by fingerprint): rows are made as keys come.

    Args:
      output_dim: embedding width.
      capacity: rows of the whole table, split evenly over the shards (each
        shard at least one batch's distinct keys of that shard, checked at run
        time). Keys without a row (unseen, not yet admitted) read the layer's
        one default row, which their gradients train.
      num_shards: shards; None: the number of ps tasks under parameter_server,
        len(devices) when devices are given, else 1.
      key_dtype: 'int64' (integer ids of any value) or 'string'; with
        stacked_features, a list of them, one per feature (string user ids and
        int64 item ids in one table), and the keys a list of one tensor per
        feature instead of one tensor whose last axis holds the features.
      min_count: training sightings before a key gets its own row (1: at once).
      max_age_steps: free the rows of keys not seen for this many training
        steps (checked every max(1, max_age_steps // 8) steps); None: never.
      embeddings_initializer: RandomUniform, RandomNormal, TruncatedNormal,
        Zeros, Ones or Constant (evicted rows are drawn anew from it).
      devices: under parameter_server, the ps devices the shards may use.
      stacked_features: the keys' last axis holds one key of each of this many
        features, each its own key space (key k of two features: two keys);
        they share the table's capacity and eviction, and each feature has a
        default row of its own. A step then costs one table's hash-table work,
        not one per feature (module doc). None: one key space.
      eviction: which rows a full shard frees: 'lfu' (least frequently used;
        equally frequent, least recently seen) or 'lru' (least recently seen);
        dynamic/eviction.py holds the policies.

    In training (``training=True``) unknown keys are counted, admitted and
    given rows; otherwise lookups only read, and unknown keys read the default row.
    """

    def __init__(
        self,
        output_dim: int,
        capacity: int,
        *,
        num_shards: int | None = None,
        key_dtype: str | Sequence[str] = "int64",
        min_count: int = 1,
        max_age_steps: int | None = None,
        embeddings_initializer: Any = "uniform",
        devices: Sequence[str] | None = None,
        stacked_features: int | None = None,
        eviction: str = "lfu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        initializer = check_arguments(
            self.name,
            output_dim=output_dim,
            capacity=capacity,
            num_shards=num_shards,
            key_dtype=key_dtype,
            min_count=min_count,
            max_age_steps=max_age_steps,
            embeddings_initializer=embeddings_initializer,
            stacked_features=stacked_features,
        )
        self.eviction = eviction
        self.__dict__["_eviction_policy"] = eviction_policy(self.name, eviction)
        self.output_dim = int(output_dim)
        self.capacity = int(capacity)
        self.num_shards = None if num_shards is None else int(num_shards)
        self.key_dtype = list(key_dtype) if isinstance(key_dtype, (list, tuple)) else key_dtype
        self.min_count = int(min_count)
        self.max_age_steps = None if max_age_steps is None else int(max_age_steps)
        self.embeddings_initializer = initializer
        self.devices = list(devices) if devices else None
        self.stacked_features = None if stacked_features is None else int(stacked_features)

    # -- variables -----------------------------------------------------------------
    def build(self, input_shape=None):
        strategy = tf.distribute.get_strategy()
        _refuse_replicas(self.name, strategy)
        rows, placement, ledger = self._plan_shards(strategy)
        with create_on(placement[0], strategy):
            self.default_row = self.add_weight(
                name="default_row",
                shape=(self.stacked_features or 1, self.output_dim),
                initializer=shard_initializer(self.embeddings_initializer, len(placement)),
                dtype=self.variable_dtype,
            )
        ledger.record(self.default_row)
        shards = []
        for i, device in enumerate(placement):
            shard = self._make_shard(i, device, rows, len(placement), strategy)
            for variable in [shard.pool, *shard.state_variables()]:
                ledger.record(variable)
            shards.append(shard)
        self.__dict__["_tfdist_dynamic_shards"] = shards
        self.__dict__["_tfdist_checkpoint"] = DynamicTableCheckpoint(lambda: self.shards)
        self.built = True

    def _plan_shards(self, strategy: tf.distribute.Strategy) -> tuple[int, list, Any]:
        """(rows per shard, each shard's device, the placement ledger): the shards placed
        bytes-balanced over the ps tasks (or `devices`) with what is already there."""
        count = self.num_shards or (
            len(self.devices) if self.devices else max(1, len(ps_devices(strategy)))
        )
        rows = -(-self.capacity // count)
        # Per row: its values, 4 int64 of bookkeeping and the policy's, a flag, 2 hash buckets.
        metadata = 4 + len(self._eviction_policy.metadata_names)
        row_bytes = self.output_dim * tf.as_dtype(self.variable_dtype).size + metadata * 8 + 1 + 32
        candidates = list(self.devices) if self.devices else ps_devices(strategy)
        ledger = placement_ledger(strategy)
        placement = (
            ledger.plan([rows * row_bytes] * count, candidates) if candidates else [None] * count
        )
        return rows, placement, ledger

    def _make_shard(
        self, i: int, device: str | None, rows: int, count: int, strategy: tf.distribute.Strategy
    ) -> DynamicTableShard:
        """Shard `i` of `count` on `device`: its pool of `rows` rows and its state."""
        with create_on(device, strategy):
            # Zeros: a row is drawn from the initializer when a key takes it (dynamic/shard.py).
            pool = self.add_weight(
                name=f"pool_shard_{i}",
                shape=(rows, self.output_dim),
                initializer="zeros",
                dtype=self.variable_dtype,
            )
            shard = DynamicTableShard(
                where=f"{self.name} shard {i}",
                pool=pool,
                reinitializer=_reinitializer(self.embeddings_initializer, i),
                min_count=self.min_count,
                max_age_steps=self.max_age_steps,
                device=_table_device(device, strategy),
                concurrent=is_parameter_server(strategy),
                layer_shards=count,
                eviction=self._eviction_policy,
            )
        pool._tfdist_dynamic_shard = shard  # read by ReshardableOptimizerMixin (slot resets)
        if shard.concurrent:  # workers update the pool at once: each update whole
            update_lock.guard(pool)
        return shard

    @property
    def shards(self) -> list[DynamicTableShard]:
        """Each shard's state (hash table, pool, counters), in shard order."""
        return list(self.__dict__.get("_tfdist_dynamic_shards", ()))

    def checkpoint_children(self, children: dict[str, Any]) -> dict[str, Any]:
        """The pools leave; the table's keys, rows and bookkeeping come as one child of any shard count."""
        pools = {id(s.pool) for s in self.shards} | {
            id(tf_compat.variable_storage(s.pool)) for s in self.shards
        }
        children = {name: child for name, child in children.items() if id(child) not in pools}
        if self.built:
            children["dynamic_table"] = self.__dict__["_tfdist_checkpoint"]
        return children

    def saved_model_children(self, children: dict[str, Any]) -> dict[str, Any]:
        """A SavedModel serves lookups: it needs each shard's key -> row table beside the pools."""
        children = dict(children)
        children.update(
            {f"rows_shard_{i}": s.key_rows.hash_table for i, s in enumerate(self.shards)}
        )
        return children

    # -- lookup --------------------------------------------------------------------
    def call(self, keys, training=None):
        if "call" in self.__dict__:  # model_parallel's placement wraps each layer's call
            raise ConfigError(
                f"{self.name}: a DynamicEmbedding does not run under model_parallel (its placement "
                f"moves layers between devices); use one_device or parameter_server."
            )
        _refuse_xla(self.name)
        keys = self._int64_keys(keys)
        out_shape = tf.concat([tf.shape(keys), [self.output_dim]], 0)
        if tf_compat.in_symbolic_scope() or tf_compat.in_stateless_scope():
            return tf.zeros(out_shape, self.compute_dtype)
        if isinstance(training, tf.Tensor):
            raise ConfigError(f"{self.name}: training must be a Python bool, not a tensor.")
        insert = bool(training)
        features = None
        if self.stacked_features:
            keys, features = stacked_keys(self.name, keys, self.stacked_features)
        flat = tf.reshape(keys, [-1])
        unique, position, counts = tf.unique_with_counts(flat, out_idx=tf.int32)
        counts = tf.cast(counts, tf.int64)
        if features is not None:  # each distinct key's feature: the one at its first position
            first = tf.math.unsorted_segment_min(tf.range(tf.size(flat)), position, tf.size(unique))
            features = tf.gather(tf.reshape(features, [-1]), first)
        shards = self.shards
        if len(shards) == 1:
            vectors = self._vectors(shards[0], unique, counts, features, insert)
        else:
            shard = shard_of(unique, len(shards))
            positions = tf.dynamic_partition(tf.range(tf.size(unique)), shard, len(shards))
            key_parts = tf.dynamic_partition(unique, shard, len(shards))
            count_parts = tf.dynamic_partition(counts, shard, len(shards))
            feature_parts = (
                [None] * len(shards)
                if features is None
                else tf.dynamic_partition(features, shard, len(shards))
            )
            parts = [
                self._vectors(s, k, c, f, insert)
                for s, k, c, f in zip(shards, key_parts, count_parts, feature_parts)
            ]
            vectors = tf.dynamic_stitch(positions, parts)
        out = tf.reshape(tf.gather(vectors, position), out_shape)
        return tf.cast(out, self.compute_dtype)

    def _int64_keys(self, keys) -> tf.Tensor:
        """The call's keys as one int64 tensor: a list of one tensor per stacked feature (each of
        its own key_dtype) becomes the features stacked on the last axis."""
        if not isinstance(keys, (list, tuple)):
            if isinstance(self.key_dtype, list):
                raise ConfigError(
                    f"{self.name}: key_dtype={self.key_dtype!r} (one per feature) needs the keys "
                    f"as a list of {len(self.key_dtype)} tensors, one per feature, got one "
                    f"{type(keys).__name__}."
                )
            return as_int64_keys(self.name, self.key_dtype, keys)
        dtypes = (
            self.key_dtype if isinstance(self.key_dtype, list) else [self.key_dtype] * len(keys)
        )
        if self.stacked_features is None or len(keys) != self.stacked_features:
            raise ConfigError(
                f"{self.name}: keys as a list of {len(keys)} tensors need stacked_features="
                f"{len(keys)} (one tensor per feature), got stacked_features="
                f"{self.stacked_features!r}."
            )
        return tf.stack(
            [as_int64_keys(self.name, dtype, k) for dtype, k in zip(dtypes, keys)], axis=-1
        )

    def _vectors(self, shard: DynamicTableShard, keys, counts, features, insert: bool) -> tf.Tensor:
        """The vector of each key: its row of the shard's pool, or the default row (of its feature
        when stacked), which then gets the key's gradient; the pool's gradient holds only rows of
        keys that have one."""
        rows = shard.lookup_or_insert(keys, counts) if insert else shard.lookup(keys)
        has_row = rows >= 0
        at_rows = tf.cast(tf.where(has_row)[:, 0], tf.int32)
        at_default = tf.cast(tf.where(~has_row)[:, 0], tf.int32)
        if features is None:
            default = tf.tile(self.default_row, [tf.size(at_default), 1])
        else:
            default = tf.gather(self.default_row, tf.gather(features, at_default))
        if insert:  # rows taken in this step are drawn by their first read
            pooled = shard.read_rows(tf.gather(rows, at_rows))
        else:
            pooled = tf_compat.sparse_read(shard.pool, tf.gather(rows, at_rows))
        return tf.dynamic_stitch([at_rows, at_default], [pooled, default])

    @property
    def table_checkpoint(self) -> DynamicTableCheckpoint:
        """The table by key, as checkpoints and `.keras` files hold it (any shard count)."""
        return self.__dict__["_tfdist_checkpoint"]

    def save_own_variables(self, store):
        dynamic_checkpoint.save_to_keras_store(self, store)

    def load_own_variables(self, store):
        dynamic_checkpoint.load_from_keras_store(self, store)

    def compute_output_shape(self, input_shape):
        if (
            isinstance(input_shape, list)
            and input_shape
            and isinstance(input_shape[0], (list, tuple))
        ):
            return tuple(input_shape[0]) + (len(input_shape), self.output_dim)
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            output_dim=self.output_dim,
            capacity=self.capacity,
            num_shards=self.num_shards,
            key_dtype=self.key_dtype,
            min_count=self.min_count,
            max_age_steps=self.max_age_steps,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
            devices=self.devices,
            stacked_features=self.stacked_features,
            eviction=self.eviction,
        )
        return config


def dynamic_tables(model: keras.layers.Layer) -> list[DynamicEmbedding]:
    """The built `DynamicEmbedding` layers in `model` (itself included), depth-first."""
    return [
        layer
        for layer in tf_compat.sublayers(model, include_self=True)
        if isinstance(layer, DynamicEmbedding) and layer.built
    ]


def dynamic_table_stats(model: keras.layers.Layer) -> dict[str, float]:
    """Counters of every dynamic table, for train records and summaries.

    ``<layer>/<counter>`` sums the shards, ``<layer>/shard_<i>/<counter>`` is
    one shard; counters: rows_in_use (now), admitted, evicted (LFU, shard
    full) and expired (max_age_steps), the last three since the table was
    created (checkpointed). Reads a few scalars from each shard's device.
    """
    stats: dict[str, float] = {}
    for layer in dynamic_tables(model):
        totals = dict.fromkeys(COUNTERS, 0.0)
        for i, shard in enumerate(layer.shards):
            for name, variable in shard.counters.items():
                value = float(variable.numpy())
                stats[f"{layer.name}/shard_{i}/{name}"] = value
                totals[name] += value
        stats.update({f"{layer.name}/{name}": value for name, value in totals.items()})
    return stats
