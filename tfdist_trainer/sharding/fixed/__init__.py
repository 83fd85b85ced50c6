"""Fixed tables: a [vocab, dim] table split by rows into N ordinary variables, read by gathers.

- weight.py: one logical table held as N shard variables (`ShardedWeight`), and its lookup.
- layer.py: what every self-sharding layer shares (`ShardedLayerMixin`, `sharded_layers`).
- embedding.py: `ShardedEmbedding`, and `EmbeddingGroup` (several tables in one call).
- softmax.py: `ShardedSoftmax`, an output layer over a sharded vocabulary.
- grouped_lookup.py: `lookup_together(weights, ids)`, many tables read with one transfer per
  ps task each way, differentiated at the rows read.
- checkpoint.py: a table saved as slices of one logical tensor, so a checkpoint restores into
  any number of shards, ps tasks and either partition strategy.
- restore.py: restores that neither draw tables they overwrite nor hold them twice.

Independent of `dynamic/` (an import contract): the kinds share only the modules beside them.
"""
