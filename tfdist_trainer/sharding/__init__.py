"""Self-sharding Keras 3 layers for large tables: `ShardedEmbedding` and `ShardedSoftmax`.

Why not `variable_partitioner`: under parameter_server it turns a layer's
variable into a `ShardedVariable`, which Keras 3 cannot differentiate
(docs/design.md). These layers split a table by rows into N *ordinary* variables
and read it with one gather per shard, so only the rows a batch needs cross
the network, and gradients are `tf.IndexedSlices`.

One concept a module:

- layout.py: how rows are split into shards ("div" or "mod", `ShardLayout`).
- shard_placement.py: which device (ps task) each shard goes to, bytes-balanced
  against what is already there (`record_all_variables`, `PlacementLedger`).
- weight.py: one logical table held as N shard variables (`ShardedWeight`),
  and its lookup.
- checkpoint.py: a table saved as slices of one logical [vocab, dim] tensor,
  so a checkpoint restores into any number of shards, ps tasks and either
  partition strategy.
- grouped_lookup.py: `lookup_together(weights, ids)`, many tables read with one
  transfer per ps task each way inside the Trainer's step (their gradient taken at
  the rows read, `tfdist_trainer.row_gradients`).
- sharded_layer.py, embedding.py (`ShardedEmbedding`, and `EmbeddingGroup`: several
  tables in one call), softmax.py: the layers.
- dynamic_keys.py, dynamic_table.py (a shard's step), dynamic_eviction.py (LFU and
  age), dynamic_shard_state.py + dynamic_checkpoint.py (checkpoints by key),
  dynamic_embedding.py: `DynamicEmbedding`,
  a table with no vocabulary size (int64 or string keys, a key -> row hash
  table and a row pool per shard; admission by `min_count`, LFU eviction when
  a shard is full, `max_age_steps`), for one_device and parameter_server, and
  `dynamic_table_stats(model)`, its counters (rows in use, admitted, evicted).
- optimizers.py: `SGD`, `SparseAdagrad` and `reshardable(cls)`, whose slots
  of sharded tables are saved as logical tables too. With a stock Keras
  optimizer the shards are also saved, by position, under
  ``optimizer/_trainable_variables``, which pins the shard count.
- reports.py: `placement_table(model_or_variables)` formats where every
  variable lives; `step_access_report` what a traced step reads.
- keras_rs/ (features: the configs; combiners: keras-rs' reductions; layer):
  `from_keras_rs(feature_configs)`, a drop-in for keras-rs'
  `DistributedEmbedding` whose tables are `ShardedEmbedding`s (keras-rs optional).
"""

from tfdist_trainer.sharding.dynamic_embedding import DynamicEmbedding, dynamic_table_stats
from tfdist_trainer.sharding.embedding import EmbeddingGroup, ShardedEmbedding
from tfdist_trainer.sharding.grouped_lookup import lookup_together
from tfdist_trainer.sharding.keras_rs import from_keras_rs
from tfdist_trainer.sharding.layout import PARTITION_STRATEGIES, ShardLayout
from tfdist_trainer.sharding.optimizers import (
    SGD,
    ReshardableOptimizerMixin,
    SparseAdagrad,
    reshardable,
)
from tfdist_trainer.sharding.reports import (
    placement_records,
    placement_table,
    step_access_report,
)
from tfdist_trainer.sharding.shard_placement import (
    PlacementLedger,
    placement_ledger,
    ps_devices,
    record_all_variables,
)
from tfdist_trainer.sharding.sharded_layer import ShardedLayerMixin, sharded_layers
from tfdist_trainer.sharding.softmax import ShardedSoftmax
from tfdist_trainer.sharding.weight import ShardedWeight

__all__ = [
    "PARTITION_STRATEGIES",
    "DynamicEmbedding",
    "EmbeddingGroup",
    "SGD",
    "PlacementLedger",
    "ReshardableOptimizerMixin",
    "ShardLayout",
    "ShardedEmbedding",
    "ShardedLayerMixin",
    "ShardedSoftmax",
    "ShardedWeight",
    "SparseAdagrad",
    "dynamic_table_stats",
    "from_keras_rs",
    "lookup_together",
    "placement_ledger",
    "placement_records",
    "placement_table",
    "ps_devices",
    "record_all_variables",
    "reshardable",
    "sharded_layers",
    "step_access_report",
]
