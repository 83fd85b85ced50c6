"""Self-sharding Keras 3 layers for large tables: `ShardedEmbedding` and `ShardedSoftmax`.

Why not `variable_partitioner`: under parameter_server it turns a layer's
variable into a `ShardedVariable`, which Keras 3 cannot differentiate
(docs/design.md). These layers split a table by rows into N *ordinary* variables
and read it with one gather per shard, so only the rows a batch needs cross
the network, and gradients are `tf.IndexedSlices`.

A home per table kind, the strategy-homes pattern:

- fixed/: tables of a fixed number of rows (`ShardedEmbedding`, `ShardedSoftmax`,
  `EmbeddingGroup`, `lookup_together`), saved as slices of one logical tensor.
- dynamic/: `DynamicEmbedding`, rows made as keys come, freed by an eviction policy
  (`dynamic/eviction.py`: LFU or LRU) and by age; saved by key.
- keras_rs/: `from_keras_rs(feature_configs)`, keras-rs configs served by fixed tables.

Shared beside them (neither kind imports the other): layout.py (how rows split: "div" or
"mod"), placement.py (which ps task each shard goes to, bytes-balanced), initializers.py (each
shard's own draw), update_lock.py (updates of a row whole), saving.py (Keras registration);
above them: optimizers.py (`SGD`, `SparseAdagrad`, `reshardable(cls)`: slots saved as logical
tables), reports.py (`placement_table`, `step_access_report`), checkpoint_mismatch.py.

Two faces: this package's names for users, and runtime_api.py, the one module `runtime/`
imports for what it asks of the tables (checkpoint parts, restores, refusals, reports).
"""

from tfdist_trainer.sharding.dynamic.embedding import DynamicEmbedding, dynamic_table_stats
from tfdist_trainer.sharding.fixed.embedding import EmbeddingGroup, ShardedEmbedding
from tfdist_trainer.sharding.fixed.grouped_lookup import lookup_together
from tfdist_trainer.sharding.fixed.layer import ShardedLayerMixin, sharded_layers
from tfdist_trainer.sharding.fixed.softmax import ShardedSoftmax
from tfdist_trainer.sharding.fixed.weight import ShardedWeight
from tfdist_trainer.sharding.keras_rs import from_keras_rs
from tfdist_trainer.sharding.layout import PARTITION_STRATEGIES, ShardLayout
from tfdist_trainer.sharding.optimizers import (
    SGD,
    ReshardableOptimizerMixin,
    SparseAdagrad,
    reshardable,
)
from tfdist_trainer.sharding.placement import (
    PlacementLedger,
    placement_ledger,
    ps_devices,
    record_all_variables,
)
from tfdist_trainer.sharding.reports import (
    placement_records,
    placement_table,
    step_access_report,
)

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
