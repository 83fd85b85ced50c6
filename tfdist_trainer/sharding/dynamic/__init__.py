"""Dynamic tables: `DynamicEmbedding`, rows made as keys come (no vocabulary size).

- embedding.py: the layer (validation, shards, the lookup) and `dynamic_table_stats`.
- shard.py: one shard's state on its device (a key -> row hash table, a row pool) and its
  training step (admission, row taking, the critical section).
- eviction.py: which rows a full shard frees, as a policy object (`LFUEviction`, `LRUEviction`)
  that owns its per-row metadata and its score, and the age sweep.
- keys.py: keys as int64 (strings by fingerprint), their shard, stacked features' key spaces.
- state.py: a shard's contents as tensors and back; checkpoint.py: a table in a checkpoint by
  key, restorable onto any number of shards.
- effects.py: the stateful ops a traced step must order.

Independent of `fixed/` (an import contract): the kinds share only the modules beside them.
"""
