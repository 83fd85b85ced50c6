"""keras-rs 0.4.0's tests of `DistributedEmbedding` and `EmbedReduce`, every table of the bridge
in three shards (README.md).

Row r in shard r % 3 ("mod"): the upstream tests look up small ids (1 to 5), which "div" would
put all in the first shard of a 23-row table (rows 0-7); so they land on all three, and the
split by shard, the per-shard gathers and the stitch back (under `jit_compile`, the masked
gather) are all exercised.
"""

from __future__ import annotations

from keras_rs_upstream import bridge, distributed_embedding_test, embed_reduce_test


class DistributedEmbedding3ShardsTest(
    bridge.Sharded, distributed_embedding_test.DistributedEmbeddingTest
):
    shards = 3
    partition_strategy = "mod"


class EmbedReduce3ShardsTest(bridge.Sharded, embed_reduce_test.EmbedReduceTest):
    shards = 3
    partition_strategy = "mod"
