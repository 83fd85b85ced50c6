"""One ps's sparse Adagrad update of the click model: `sharding.SparseAdagrad` against TF's own ways.

What a ps runs for one worker step of the click model (configs/sharded_embedding/100m.gin,
parameter_server with 2 ps): the update of its half of each of the 26 tables, with the
distinct ids a batch of the recipe's synthetic data has in that half. Each variant sums
repeated rows first (as tf-keras' optimizers and `SparseAdagrad` do), then updates:

  sparse_adagrad  the library's `sharding.SparseAdagrad` (Keras optimizer `apply`): the rows of
                  the accumulator and the table read once, written back whole (`scatter_update`)
  scatters        the same arithmetic by TF's `scatter_add` / `scatter_sub` (the library's update
                  before db1f6ab; Keras' own Adagrad on IndexedSlices writes the same scatters)
  fused           TF's fused `ResourceSparseApplyAdagradV2` (what tf-keras' Adagrad runs)

Each variant in its own process, one after another per round; one timed request is --steps
updates in one `tf.function` call each. Reported: updates/s and CPU ms per update, and how
much less CPU the library's update takes than `scatters`: a ps shares its cores with the other
tasks, so its CPU, not its wall time, sets the cluster's steps/s (BUILD.md: perf on the real
cluster put TF's scatters at 36% of a ps's CPU). The variants apply the same gradients, so
their tables end equal.
"""

from __future__ import annotations

import statistics

from benchmarks import _bench

NAME = "sparse_update"
VARIANTS = ("sparse_adagrad", "scatters", "fused")
RECIPE = f"{_bench.REPO}/configs/sharded_embedding/100m.gin"
LEARNING_RATE, EPSILON, INITIAL_ACCUMULATOR = 0.05, 1e-7, 0.1


def parse_args(argv):
    p = _bench.parser(
        NAME, __doc__, steps=300, repeats=3, warmup_steps=20, batch_size=1024, max_rows=10**9
    )
    p.add_argument("--num_ps", type=int, default=2, help="the update is ps:0's share of each table")
    smoke = "--steps=5 --repeats=1 --warmup_steps=2 --batch_size=64 --max_rows=3000"
    return _bench.parse(p, argv, smoke)


def shard_ids(args) -> tuple[list[int], list[list]]:
    """ps:0's rows of each table ('div' partition) and, per batch, the distinct ids it updates."""
    import gin
    import tensorflow as tf

    import recipes.sharded_embedding.trainer  # noqa: F401 - registers ClickTrainer
    from recipes.sharded_embedding.data import SyntheticClicks

    gin.parse_config_files_and_bindings([RECIPE], [], skip_unknown=True)
    vocab = [min(v, args.max_rows) for v in gin.query_parameter("ClickTrainer.vocab_sizes")]
    rows = [max(1, -(-v // args.num_ps)) for v in vocab]  # the first shard's rows
    clicks = SyntheticClicks(vocab, num_dense=13, seed=7)
    batches = []
    for b in range(8):
        features, _ = clicks.batch(tf.constant(b), args.batch_size)
        ids = features["categorical"].numpy()
        # distinct, in the order of first appearance (a worker's `tf.unique`), not sorted
        batches.append([_in_order_seen(ids[:, t][ids[:, t] < rows[t]]) for t in range(len(vocab))])
    return rows, batches


def _in_order_seen(ids):
    import numpy as np

    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def serve(args):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist_trainer import sharding

    variant = args.variant_process
    rows, batches = shard_ids(args)
    rng = np.random.default_rng(args.seed)
    initial = [rng.standard_normal((r, 17), dtype=np.float32) for r in rows]
    gradients = [
        [
            tf.IndexedSlices(
                tf.constant(rng.standard_normal((len(i), 17), dtype=np.float32)),
                tf.constant(i, tf.int64),
            )
            for i in batch
        ]
        for batch in batches
    ]

    if variant == "sparse_adagrad":
        optimizer = sharding.SparseAdagrad(
            LEARNING_RATE, initial_accumulator_value=INITIAL_ACCUMULATOR, epsilon=EPSILON
        )
        stored = [keras.Variable(t, name=f"table_{n}") for n, t in enumerate(initial)]
        optimizer.build(stored)

        @tf.function(reduce_retracing=True)  # each batch has its own count of ids
        def update(grads):
            optimizer.apply(grads, stored)

    else:
        stored = [tf.Variable(t) for t in initial]
        accumulators = [tf.Variable(tf.fill(t.shape, INITIAL_ACCUMULATOR)) for t in initial]

        @tf.function(reduce_retracing=True)  # each batch has its own count of ids
        def update(grads):
            for table, accumulator, grad in zip(stored, accumulators, grads):
                indices, position = tf.unique(grad.indices)
                values = tf.math.unsorted_segment_sum(grad.values, position, tf.size(indices))
                if variant == "fused":
                    tf.raw_ops.ResourceSparseApplyAdagradV2(
                        var=table.handle,
                        accum=accumulator.handle,
                        lr=tf.constant(LEARNING_RATE),
                        epsilon=tf.constant(EPSILON),
                        grad=values,
                        indices=indices,
                    )
                    continue
                accumulator.scatter_add(tf.IndexedSlices(tf.square(values), indices))
                accumulated = tf.gather(accumulator, indices)
                table.scatter_sub(
                    tf.IndexedSlices(
                        LEARNING_RATE * values / tf.sqrt(accumulated + EPSILON), indices
                    )
                )

    done = [0]

    def run(steps: int) -> str:
        for _ in range(steps):
            update(gradients[done[0] % len(gradients)])
            done[0] += 1
        # the tables after every update so far, for the parent to compare between variants
        return " ".join(f"{float(tf.reduce_sum(tf.abs(t))):.6e}" for t in stored[:3])

    run.info = {
        "tables": len(rows),
        "rows": int(sum(rows)),
        "distinct_ids_per_update": float(np.mean([sum(len(i) for i in b) for b in batches])),
    }
    _bench.serve_variant(lambda: run, args.warmup_steps)


def run(args):
    with _bench.Variants(args, list(VARIANTS)) as v:
        times = v.time(args.steps, args.repeats)
    results = {name: v.result(name, final_tables=v.last[name]) for name in VARIANTS}
    _bench.add_ratios(results, times, "scatters")
    # On a ps the cores are shared with the other tasks: its CPU per update is what counts.
    cpu = {name: [r["user_s"] + r["sys_s"] for r in v.runs[name]] for name in VARIANTS}
    library = results["sparse_adagrad"]
    library["cpu_ratio_vs_baseline"] = statistics.median(cpu["scatters"]) / statistics.median(
        cpu["sparse_adagrad"]
    )
    figure = _bench.figure(
        "one ps's sparse Adagrad update of the click model (100m.gin, 2 ps)",
        library["user_ms_per_step"] + library["sys_ms_per_step"],
        "CPU ms per update",
        "the same update by TF's scatter_add / scatter_sub (scatters)",
        library["cpu_ratio_vs_baseline"],
        "less CPU",
        args.repeats,
        _bench.ratio_spread(cpu["scatters"], cpu["sparse_adagrad"]),
    )
    rows = [
        [name, *_bench.rate_cells(r), f"{r['user_ms_per_step'] + r['sys_ms_per_step']:.2f}"]
        for name, r in results.items()
    ]
    _bench.record(
        args,
        header=f"ps:0 of {args.num_ps}: {library['tables']} shards, {library['rows']:,} rows x 17 "
        f"floats, {library['distinct_ids_per_update']:,.0f} distinct ids an update (batch "
        f"{args.batch_size}); {args.steps} updates x {args.repeats} (median, min..max)",
        columns=["variant", *_bench.RATE_COLUMNS, "CPU ms / update"],
        rows=rows,
        environment=v.environment(),
        baseline="scatters",
        results=results,
        figures=[figure],
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
