"""keras-rs 0.4.0's tests of `DistributedEmbedding` and `EmbedReduce`, every table of the bridge
in one shard: the bridge as a plain drop-in (README.md)."""

from __future__ import annotations

from keras_rs_upstream import bridge, distributed_embedding_test, embed_reduce_test


class DistributedEmbedding1ShardTest(
    bridge.Sharded, distributed_embedding_test.DistributedEmbeddingTest
):
    shards = 1


class EmbedReduce1ShardTest(bridge.Sharded, embed_reduce_test.EmbedReduceTest):
    shards = 1
