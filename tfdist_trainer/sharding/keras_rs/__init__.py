"""`from_keras_rs(feature_configs)`: keras-rs embedding configs, served by self-sharding tables.

keras-rs 0.4's `keras_rs.layers.DistributedEmbedding` accelerates only TPU
SparseCore. On TF CPU/GPU it is one plain Keras `Embedding` per table, so under
parameter_server every table lands whole on one ps, and `TableConfig.optimizer`
is ignored (docs/design.md, "Why large tables shard themselves"). This bridge keeps the keras-rs configs
(`TableConfig`, `FeatureConfig`, in any nesting) as the source of truth and
returns a drop-in layer: same nested inputs and outputs, same combiners, one
`ShardedEmbedding` per table, so each table is split by rows over the ps tasks
(bytes-balanced), lookups are sparse gathers and gradients `tf.IndexedSlices`.

    import keras_rs
    from tfdist_trainer import sharding

    table = keras_rs.layers.TableConfig(name="item", vocabulary_size=1_000_000, embedding_dim=16)
    features = {"item": keras_rs.layers.FeatureConfig("item", table, (None,), (None, 16))}
    embedding = sharding.from_keras_rs(features)  # was: keras_rs.layers.DistributedEmbedding(features)

What follows keras-rs 0.4 exactly (its `EmbedReduce`): ids of rank 1 are looked
up without reduction; ids of rank 2 or more (dense), `tf.RaggedTensor` ragged
in dimension 1, and `tf.SparseTensor` are reduced over their last dimension by
the table's combiner ('sum', 'mean', 'sqrtn', with optional per-id `weights`
of the same structure; empty rows give zeros); features naming the same
`TableConfig` object share one table; `table_stacking` is ignored and
`update_stats=True` is refused with a ValueError, as by keras-rs' TensorFlow
layer. What differs: ids must lie in [0, vocabulary_size) (keras-rs wraps
negative ids; here they fail an assertion); output shapes follow the input's
batch dimension (None in a functional model) where keras-rs reports
`FeatureConfig.output_shape` literally; an input whose rank disagrees with
`FeatureConfig.input_shape` is an error (keras-rs computes that check and drops
the result); a table of N shards is N variables of its rows
(`<table>/embeddings_shard_<i>` in `trainable_variables`) where keras-rs has
one [vocabulary_size, embedding_dim] variable (`get_embedding_tables()` gives
whole tables in both); the initializer runs once per shard (the same law as
keras-rs's for its default `fan_out` scaling, a `fan_in` scaling sees the
shard's rows); `TableConfig.optimizer` is not honoured (one warning names the
tables; the Trainer's optimizer trains them, as keras-rs off TPU trains them
with the model's); placement "sparsecore" is refused.

keras-rs 0.4.0's own tests of `DistributedEmbedding` and `EmbedReduce` run
against this bridge, with 1 and 3 shards, in tests/unit/keras_rs_upstream/; each
difference above that they meet is marked there as an expected failure.
"""

from tfdist_trainer.sharding.keras_rs.features import COMBINERS, PLACEMENTS
from tfdist_trainer.sharding.keras_rs.layer import KerasRsEmbedding, from_keras_rs

__all__ = ["COMBINERS", "PLACEMENTS", "KerasRsEmbedding", "from_keras_rs"]
