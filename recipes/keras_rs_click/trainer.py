"""A DLRM / DCN-v2 click model written with keras-rs, its tables served by `sharding.from_keras_rs`.

The model a keras-rs user writes: a bottom MLP over the dense features, one
`keras_rs.layers.TableConfig` / `FeatureConfig` per categorical feature, DLRM's
pairwise `keras_rs.layers.DotInteraction` over the dense vector and the
embeddings, DCN-v2 `keras_rs.layers.FeatureCross` layers over that, and a top
MLP. The only line that differs from keras-rs' own recipe is the embedding:
``sharding.from_keras_rs(feature_configs)`` in place of
``keras_rs.layers.DistributedEmbedding(feature_configs)``, so under
parameter_server every table is split by rows over the ps tasks instead of
landing whole on one. The data are the sharded-embedding recipe's synthetic
clicks (a hidden logistic model over ids and dense features).

keras-rs is a test dependency (``pip install 'keras-rs>=0.4,<0.5'``).
"""

from __future__ import annotations

from collections.abc import Sequence

import gin
import keras
import keras_rs
import tensorflow as tf

from recipes.sharded_embedding import data as click_data
from tfdist_trainer import Trainer, sharding


@gin.configurable
class KerasRsDlrmTrainer(Trainer):
    """DLRM with DCN-v2 cross layers over keras-rs tables that shard themselves.

    Args:
      vocab_sizes: rows of each categorical feature's table.
      embedding_dim: width of every table and of the bottom MLP's output (DotInteraction
        takes the dot product of every pair, so all have one width).
      bottom_units: the bottom MLP's hidden widths (its last layer has embedding_dim units).
      num_cross_layers: DCN-v2 FeatureCross layers over [dense vector, interactions].
      projection_dim: FeatureCross' low-rank projection; None: full rank.
      top_units: the top MLP's widths before the logit.
      num_shards: shards per table (capped at its rows); None: one per ps task.
      learning_rate: SparseAdagrad's learning rate (sparse rows for the tables).
      num_dense: dense features.
      synthetic_seed: fixes the hidden click model of the synthetic data.
      eval_batches: evaluation batches (fixed examples, the same in every run).
      global_batch_size, eval_batch_size: Trainer's; None: its gin bindings
        (`Trainer.global_batch_size`) or defaults.
    """

    def __init__(
        self,
        *,
        vocab_sizes: Sequence[int] = (1000, 100, 10),
        embedding_dim: int = 8,
        bottom_units: Sequence[int] = (32,),
        num_cross_layers: int = 2,
        projection_dim: int | None = None,
        top_units: Sequence[int] = (32, 16),
        num_shards: int | None = None,
        learning_rate: float = 0.05,
        num_dense: int = click_data.CRITEO_NUM_DENSE,
        synthetic_seed: int = 0,
        eval_batches: int = 4,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        self.embedding_dim = int(embedding_dim)
        self.bottom_units = tuple(bottom_units)
        self.num_cross_layers = int(num_cross_layers)
        self.projection_dim = projection_dim
        self.top_units = tuple(top_units)
        self.num_shards = num_shards
        self.learning_rate = learning_rate
        self.num_dense = num_dense
        self.eval_batches = eval_batches
        self.synthetic = click_data.SyntheticClicks(
            self.vocab_sizes, num_dense=num_dense, seed=synthetic_seed
        )

    def feature_configs(self) -> dict[str, keras_rs.layers.FeatureConfig]:
        """One table per categorical feature, one id per example, as a keras-rs user writes them."""
        configs = {}
        for f, vocab in enumerate(self.vocab_sizes):
            table = keras_rs.layers.TableConfig(
                name=f"table_{f}",
                vocabulary_size=vocab,
                embedding_dim=self.embedding_dim,
                initializer=keras.initializers.RandomUniform(-0.05, 0.05),
            )
            configs[f"cat_{f}"] = keras_rs.layers.FeatureConfig(
                name=f"cat_{f}",
                table=table,
                input_shape=(None,),  # the batch: its size differs per strategy
                output_shape=(None, self.embedding_dim),
            )
        return configs

    # -- model ---------------------------------------------------------------
    def build_model(self) -> keras.Model:
        dense_in = keras.Input((self.num_dense,), name="dense")
        categorical_in = keras.Input((len(self.vocab_sizes),), dtype="int64", name="categorical")
        # The tables are called first, so they are built first: with nothing on the ps tasks
        # yet, each table's shards spread evenly over them. Built after the dense layers, a
        # small table could fill the dense layers' imbalance whole on one ps.
        embedding = sharding.from_keras_rs(
            self.feature_configs(), num_shards=self.num_shards, name="embedding"
        )
        ids = {f"cat_{f}": categorical_in[:, f] for f in range(len(self.vocab_sizes))}
        embedded = embedding(ids)
        x = dense_in
        for i, units in enumerate((*self.bottom_units, self.embedding_dim)):
            x = keras.layers.Dense(units, activation="relu", name=f"bottom_{i}")(x)
        features = [x, *(embedded[name] for name in sorted(embedded))]
        interactions = keras_rs.layers.DotInteraction(name="dot_interaction")(features)
        x0 = keras.layers.Concatenate(name="interaction_concat")([x, interactions])
        crossed = x0
        for i in range(self.num_cross_layers):
            crossed = keras_rs.layers.FeatureCross(
                projection_dim=self.projection_dim, name=f"cross_{i}"
            )(x0, crossed)
        for i, units in enumerate(self.top_units):
            crossed = keras.layers.Dense(units, activation="relu", name=f"top_{i}")(crossed)
        logit = keras.layers.Dense(1, name="logit")(crossed)
        return keras.Model(
            {"dense": dense_in, "categorical": categorical_in}, logit, name="keras_rs_dlrm"
        )

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        return sharding.SparseAdagrad(self.learning_rate)

    def compute_loss(self, labels, predictions):
        return keras.losses.binary_crossentropy(labels, predictions, from_logits=True)

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.AUC(from_logits=True, name="auc")]

    # -- data ----------------------------------------------------------------
    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return self.synthetic.dataset(
            self.per_replica_batch_size(input_context),
            pipeline_id=input_context.input_pipeline_id,
            num_pipelines=input_context.num_input_pipelines,
        )

    def build_eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Far from every training stream; the same examples in every run.
        return self.synthetic.dataset(
            self.eval_batch_size, first_batch=1 << 50, num_batches=self.eval_batches
        )
