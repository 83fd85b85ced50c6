"""The sharded-embedding recipe: a click-through model whose tables shard themselves.

Wide & deep over per-feature `ShardedEmbedding` tables: each categorical
feature has one table of width ``1 + embedding_dim`` whose first column is the
feature's wide (linear) weight and whose other columns are its deep embedding.
The dense features go through a linear term and a bottom layer; the deep part
is an MLP over the concatenated embeddings. Vocabulary sizes, widths, shard
counts and the optimizer are gin bindings (configs/sharded_embedding/*.gin).

At build time the chief logs a placement table (variable, shape, bytes,
device, bytes per ps) and writes it as ``placement.json`` into the report
directory (default: ``--model_dir``); with ``ClickTrainer.step_report = True``
it also writes ``step_graph.json``, which says how the traced training step
touches the tables (sparse gathers/scatters only, no op of a whole table's
shape).

Raw ids (``id_space='open'``: 64-bit ids of any value; ``key_dtype='string'``: strings, e.g.
Criteo's hex values as they are) are keys of dynamic tables (``dynamic_capacity``), or, for
fixed tables, hashed into each table's rows first (`BucketHash`: a fingerprint mod the rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gin
import keras
import tensorflow as tf

from recipes.sharded_embedding import data as click_data
from tfdist_trainer import Trainer, sharding, variables
from tfdist_trainer.io import storage


class BucketHash(keras.layers.Layer):
    """Raw ids (int64 of any value, or strings) -> rows of a fixed table of `num_buckets` rows:
    their 64-bit FarmHash fingerprint (`tf.fingerprint`, stable across platforms) mod the rows.
    Distinct ids may share a row (collisions): what dynamic tables avoid."""

    def __init__(self, num_buckets: int, **kwargs):
        super().__init__(**kwargs)
        self.num_buckets = int(num_buckets)

    def call(self, ids):
        fingerprints = tf.bitcast(tf.fingerprint(tf.reshape(ids, [-1])), tf.int64)
        rows = tf.math.floormod(fingerprints, tf.constant(self.num_buckets, tf.int64))
        return tf.reshape(rows, tf.shape(ids))

    def compute_output_spec(self, ids):
        return keras.KerasTensor(ids.shape, dtype="int64")

    def get_config(self):
        return {**super().get_config(), "num_buckets": self.num_buckets}


def _per_feature(name: str, value: Any, count: int) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(
                f"ClickTrainer.{name} has {len(value)} entries but there are {count} features "
                f"(ClickTrainer.vocab_sizes); give one per feature or a single value."
            )
        return list(value)
    return [value] * count


@gin.configurable
class ClickTrainer(Trainer):
    """Wide & deep click-through model over sharded embedding tables.

    Args:
      vocab_sizes: rows of each categorical feature's table (26 for Criteo).
      embedding_dim: deep embedding width, one value or one per feature.
      num_shards: shards per table: one per feature (exact), or one value for all tables
        (capped at each table's rows); None: one per ps task under parameter_server, else 1.
      partition_strategy: 'div' or 'mod' (see tfdist_trainer.sharding).
      hidden_units: the deep MLP's layer widths.
      optimizer: 'adagrad' (SparseAdagrad: sparse rows only) or 'sgd' (no slots: half the memory).
      learning_rate: the optimizer's learning rate.
      num_dense: dense features (13 for Criteo).
      data_source: 'synthetic' or 'criteo'.
      id_space: the synthetic ids: 'fixed' (below vocab_sizes) or 'open' (raw 64-bit ids, a
        Zipf-like head of vocab_sizes[f] ids and a tail of new ids; `data.SyntheticClicks`).
      key_dtype: the categorical input: 'int64', or 'string' (raw keys: Criteo's hex strings as
        they are, synthetic ids as 16 hex digits).
      criteo_train_files / criteo_eval_files: glob patterns of Criteo TSV files.
      synthetic_seed: fixes the hidden click model of the synthetic data.
      eval_batches: synthetic evaluation batches (fixed examples, the same in every run).
      report_dir: where placement.json / step_graph.json go; None: the run's model_dir
        (`self.context`; none outside a run).
      step_report: also write step_graph.json when the training step is traced.
      dynamic_capacity: rows of each dynamic table (`sharding.DynamicEmbedding`; over all its
        shards), one value or one per feature: each id gets its own row (no vocabulary: ids are
        keys, not row numbers); None: fixed `ShardedEmbedding` tables of `vocab_sizes` rows (raw
        ids, open or strings, hashed into them by `BucketHash`).
      min_count: with dynamic tables, sightings before an id gets its own row.
      max_age_steps: with dynamic tables, rows not seen for that many steps are freed.
      eviction: with dynamic tables, which rows a full shard frees: 'lfu' or 'lru'
        (`sharding.DynamicEmbedding`'s eviction).
      stacked_tables: with dynamic tables, the features' tables as one `DynamicEmbedding` of
        their summed capacity (``stacked_features``: each feature its own key space and default
        row, one hash-table step per shard instead of one per feature: the fast layout); the
        features then share the capacity and the LFU eviction. Needs one embedding_dim.
      global_batch_size, eval_batch_size: Trainer's; None: its gin bindings
        (`Trainer.global_batch_size`) or defaults.
    """

    def __init__(
        self,
        *,
        vocab_sizes: Sequence[int] = (1000, 1000),
        embedding_dim: int | Sequence[int] = 8,
        num_shards: int | None | Sequence[int | None] = None,
        partition_strategy: str = "div",
        hidden_units: Sequence[int] = (64, 32),
        optimizer: str = "adagrad",
        learning_rate: float = 0.05,
        num_dense: int = click_data.CRITEO_NUM_DENSE,
        data_source: str = "synthetic",
        id_space: str = "fixed",
        key_dtype: str = "int64",
        criteo_train_files: str | None = None,
        criteo_eval_files: str | None = None,
        synthetic_seed: int = 0,
        eval_batches: int = 20,
        report_dir: str | None = None,
        step_report: bool = False,
        dynamic_capacity: int | Sequence[int] | None = None,
        min_count: int = 1,
        max_age_steps: int | None = None,
        eviction: str = "lfu",
        stacked_tables: bool = False,
        global_batch_size: int | None = None,
        eval_batch_size: int | None = None,
    ):
        batch_sizes = {"global_batch_size": global_batch_size, "eval_batch_size": eval_batch_size}
        super().__init__(**{k: v for k, v in batch_sizes.items() if v is not None})
        if data_source not in ("synthetic", "criteo"):
            raise ValueError(
                f"ClickTrainer.data_source must be 'synthetic' or 'criteo', got {data_source!r}."
            )
        if optimizer not in ("adagrad", "sgd"):
            raise ValueError(
                f"ClickTrainer.optimizer must be 'adagrad' or 'sgd', got {optimizer!r}."
            )
        if id_space not in click_data.ID_SPACES or key_dtype not in click_data.KEY_DTYPES:
            raise ValueError(
                f"ClickTrainer.id_space must be 'fixed' or 'open' and ClickTrainer.key_dtype "
                f"'int64' or 'string', got {id_space!r} and {key_dtype!r}."
            )
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        count = len(self.vocab_sizes)
        self.embedding_dims = [int(d) for d in _per_feature("embedding_dim", embedding_dim, count)]
        # exact per table (too many for a table is an error)
        if isinstance(num_shards, (list, tuple)):
            self.num_shards = _per_feature("num_shards", num_shards, count)
        else:  # one count for all: small tables get at most one shard per row
            self.num_shards = [
                None if num_shards is None else min(int(num_shards), v) for v in self.vocab_sizes
            ]
        self.partition_strategy = partition_strategy
        self.hidden_units = tuple(hidden_units)
        self.optimizer_name = optimizer
        self.learning_rate = learning_rate
        self.num_dense = num_dense
        self.data_source = data_source
        self.criteo_train_files = criteo_train_files
        self.criteo_eval_files = criteo_eval_files
        self.eval_batches = eval_batches
        self.report_dir = report_dir
        self.step_report = step_report
        self.dynamic_capacity = (
            None
            if dynamic_capacity is None
            else _per_feature("dynamic_capacity", dynamic_capacity, count)
        )
        if stacked_tables and len(set(self.embedding_dims)) != 1:
            raise ValueError(
                f"ClickTrainer.stacked_tables needs one embedding_dim for every feature, got "
                f"{sorted(set(self.embedding_dims))}."
            )
        self.stacked_tables = bool(stacked_tables) and self.dynamic_capacity is not None
        self.id_space = id_space
        self.key_dtype = key_dtype
        self.min_count = min_count
        self.max_age_steps = max_age_steps
        self.eviction = eviction
        self.synthetic = click_data.SyntheticClicks(
            self.vocab_sizes,
            num_dense=num_dense,
            seed=synthetic_seed,
            id_space=id_space,
            key_dtype=key_dtype,
        )
        self._asynchronous_workers = False
        self._step_report_written = False

    def record_tags(self) -> dict[str, str]:
        return {"data": self.data_source}

    # -- model ---------------------------------------------------------------
    def build_model(self) -> keras.Model:
        strategy = tf.distribute.get_strategy()
        self._asynchronous_workers = bool(sharding.ps_devices(strategy))
        # Every variable is created here, inside record_all_variables, so the ledger sees all of them:
        # the dense layers first (built explicitly), then the tables, whose shards the ledger
        # places on the ps tasks with the fewest bytes so far.
        with sharding.record_all_variables():
            dense_linear = keras.layers.Dense(1, name="dense_linear")
            dense_bottom = keras.layers.Dense(
                self.embedding_dims[0], activation="relu", name="dense_bottom"
            )
            dense_linear.build((None, self.num_dense))
            dense_bottom.build((None, self.num_dense))
            mlp, width = [], self.embedding_dims[0] + sum(self.embedding_dims)
            for i, units in enumerate(self.hidden_units):
                mlp.append(keras.layers.Dense(units, activation="relu", name=f"mlp_{i}"))
                mlp[-1].build((None, width))
                width = units
            deep_logit = keras.layers.Dense(1, name="deep_logit")
            deep_logit.build((None, width))

            dense_in = keras.Input((self.num_dense,), name="dense")
            categorical_in = keras.Input(
                (len(self.vocab_sizes),), dtype=self.key_dtype, name="categorical"
            )
            wide_terms, deep_terms = [dense_linear(dense_in)], [dense_bottom(dense_in)]
            for rows in self._feature_rows(categorical_in):
                # The feature's wide (linear) weight and its deep embedding. A split, not two
                # slices: its gradient is one concat, theirs two StridedSliceGrads (each zeroes a
                # whole row block) and their sum.
                wide, deep = keras.ops.split(rows, [1], axis=-1)
                wide_terms.append(wide)
                deep_terms.append(deep)
            x = keras.layers.Concatenate(name="deep_concat")(deep_terms)
            for layer in mlp:
                x = layer(x)
            wide_terms.append(deep_logit(x))
            logit = keras.layers.Add(name="logit")(wide_terms)
            model = keras.Model(
                {"dense": dense_in, "categorical": categorical_in}, logit, name="click_model"
            )
        self._report_placement(model)
        return model

    def _feature_rows(self, categorical: Any) -> list:
        """Each feature's row [wide weight, deep embedding] for the categorical input."""
        count = len(self.vocab_sizes)
        if self.stacked_tables:
            stacked = self._stacked_table()(categorical)
            return [stacked[:, f] for f in range(count)]
        ids = [categorical[:, f] for f in range(count)]
        if self.dynamic_capacity is not None:
            return [
                self._dynamic_table(dim, capacity, shards, name=f"table_{f}")(i)
                for f, (i, dim, capacity, shards) in enumerate(
                    zip(ids, self.embedding_dims, self.dynamic_capacity, self.num_shards)
                )
            ]
        if self._raw_ids():
            ids = [
                BucketHash(v, name=f"bucket_hash_{f}")(i)
                for f, (v, i) in enumerate(zip(self.vocab_sizes, ids))
            ]
        # One group: under parameter_server one read per ps task for all the tables (EmbeddingGroup).
        tables = [
            self._table(f, vocab, dim, shards)
            for f, (vocab, dim, shards) in enumerate(
                zip(self.vocab_sizes, self.embedding_dims, self.num_shards)
            )
        ]
        return sharding.EmbeddingGroup(tables, name="tables")(ids)

    def _table(self, f: int, vocab: int, dim: int, shards: int | None) -> keras.layers.Layer:
        """Feature f's table of fixed rows (ids < vocab)."""
        initializer = keras.initializers.RandomUniform(-0.01, 0.01)
        return sharding.ShardedEmbedding(
            vocab,
            1 + dim,
            num_shards=shards,
            partition_strategy=self.partition_strategy,
            embeddings_initializer=initializer,
            name=f"table_{f}",
        )

    def _stacked_table(self) -> keras.layers.Layer:
        """Every feature's dynamic table as one (`stacked_tables`): the capacities summed."""
        shards = set(self.num_shards)
        return self._dynamic_table(
            self.embedding_dims[0],
            sum(self.dynamic_capacity),
            max(shards) if None not in shards else None,
            name="tables",
            stacked_features=len(self.vocab_sizes),
        )

    def _dynamic_table(
        self, dim: int, capacity: int, shards: int | None, **kwargs: Any
    ) -> keras.layers.Layer:
        """A dynamic table of the recipe's settings (a feature's, or the stacked features')."""
        return sharding.DynamicEmbedding(
            1 + dim,
            capacity,
            num_shards=shards,
            key_dtype=self.key_dtype,
            min_count=self.min_count,
            max_age_steps=self.max_age_steps,
            eviction=self.eviction,
            embeddings_initializer=keras.initializers.RandomUniform(-0.01, 0.01),
            **kwargs,
        )

    def _raw_ids(self) -> bool:
        """Whether the categorical inputs are raw ids (not row numbers below vocab_sizes)."""
        return self.key_dtype == "string" or (
            self.data_source == "synthetic" and self.id_space == "open"
        )

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        if self.optimizer_name == "sgd":
            return sharding.SGD(self.learning_rate)
        return sharding.SparseAdagrad(self.learning_rate)

    def compute_loss(self, labels, predictions):
        return keras.losses.binary_crossentropy(labels, predictions, from_logits=True)

    def build_metrics(self) -> list[keras.metrics.Metric]:
        return [keras.metrics.AUC(from_logits=True, name="auc")]

    # -- data ----------------------------------------------------------------
    def build_train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = self.per_replica_batch_size(input_context)
        if self.data_source == "criteo":
            return click_data.criteo_dataset(
                self.criteo_train_files,
                batch,
                self.vocab_sizes,
                num_dense=self.num_dense,
                input_context=input_context,
                key_dtype=self.key_dtype,
            )
        first = 0
        if self._asynchronous_workers:
            # Each parameter_server worker already reads its own share: input_pipeline_id is its
            # index, bound when the coordinator makes the dataset on it
            # (tfdist_trainer.trainers.data.worker_input_context). What a share cannot tell apart
            # is a second start: the coordinator makes a recovered worker's dataset again, which
            # would begin its share at batch 0 and repeat the batches it trained on. A start
            # drawn from the clock puts every start elsewhere in the 2**40-batch stream.
            first = tf.cast(tf.timestamp() * 1e6, tf.int64) % (1 << 40)
        return self.synthetic.dataset(
            batch,
            first_batch=first,
            pipeline_id=input_context.input_pipeline_id,
            num_pipelines=input_context.num_input_pipelines,
        )

    def build_eval_dataset(
        self, input_context: tf.distribute.InputContext
    ) -> tf.data.Dataset | None:
        if self.data_source == "criteo":
            if not self.criteo_eval_files:
                return None
            return click_data.criteo_dataset(
                self.criteo_eval_files,
                self.eval_batch_size,
                self.vocab_sizes,
                num_dense=self.num_dense,
                training=False,
                key_dtype=self.key_dtype,
            )
        # Far from every training stream; the same examples in every run (with id_space='open':
        # the same head, and tail ids no training batch drew, as on the next day of a log).
        return self.synthetic.dataset(
            self.eval_batch_size, first_batch=1 << 50, num_batches=self.eval_batches
        )

    # -- step ----------------------------------------------------------------
    def train_step(self, batch):
        loss = super().train_step(batch)
        if self.step_report and not self._step_report_written and self._is_chief():
            self._report_step_graph(tf.compat.v1.get_default_graph())
        return loss

    @tf.autograph.experimental.do_not_convert
    def _report_step_graph(self, graph) -> None:
        # Runs while the step is traced: `graph` holds the step's ops.
        self._write_report("step_graph.json", sharding.step_access_report(graph, self.model))
        self._step_report_written = True

    # -- reports -------------------------------------------------------------
    def _is_chief(self) -> bool:
        """Whether this task writes reports: the chief (or a lone process, outside a run)."""
        return self.context is None or self.context.is_chief

    def _report_dir(self) -> str | None:
        if self.report_dir:
            return self.report_dir
        return self.context.model_dir if self.context is not None else None

    def _write_report(self, name: str, payload: Any) -> None:
        directory = self._report_dir()
        if directory:  # write_report creates the directory
            variables.write_report(storage.join(directory, name), payload)

    def _report_placement(self, model: keras.Model) -> None:
        # The library logs the one-line summary, and the whole table to the task's log only.
        if not self._is_chief():
            return
        self._write_report("placement.json", sharding.placement_records(model))
