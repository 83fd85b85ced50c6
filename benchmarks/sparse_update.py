"""One ps's sparse Adagrad update of the click model: `sharding.SparseAdagrad` against TF's own
ways, by one updater and by several at once (their lost updates).

What a ps runs for one worker step of the click model (configs/sharded_embedding/100m.gin,
parameter_server with 2 ps): the update of its half of each of the 26 tables, with the
distinct ids a batch of the recipe's synthetic data has in that half. Each variant sums
repeated rows first (as tf-keras' optimizers and `SparseAdagrad` do), then updates:

  sparse_adagrad           the library's `sharding.SparseAdagrad` (Keras optimizer `apply`) as it
                           runs under parameter_server: each table guarded (`update_lock.guard`),
                           so each update of a shard runs whole under the shard's lock; the rows
                           of the accumulator and the table read once, written back whole
                           (`scatter_update`)
  sparse_adagrad_unlocked  the same without the lock (the library's update before the lock)
  scatters                 the same arithmetic by TF's `scatter_add` / `scatter_sub` (the library's
                           update before db1f6ab; Keras' own Adagrad on IndexedSlices writes the
                           same scatters)
  fused                    TF's fused `ResourceSparseApplyAdagradV2` (what tf-keras' Adagrad runs)

Why several updaters: under parameter_server every worker applies its own updates to the
ps's tables whenever its step ends, so updates of one shard run at the same time. A
read-modify-write update (the library's) that interleaves with another loses one of them
whole: before the lock, 4 workers lost 37-44% of SparseAdagrad's updates of the rows every
batch touches. So each variant is also run by --updaters threads at once (default 1, 2 and 4;
released together by a `threading.Barrier`, like workers updating one ps), each applying
--steps updates of its own batches (thread i of n the batches i, i+n, ...), and the report
puts beside its CPU the share of updates lost, measured on the accumulator: lost = 1 - (what
the accumulator gained) / (the exact sum over the updates applied of the squared
per-row-summed gradients, computed in numpy from the gradients each thread applied); per
request, the gain summed in float64 over the rows any batch touches (the others keep their
initial value), and again over the head rows alone (per table, those every batch touches: the
small tables and the Zipf head, which every concurrent update of a table writes). The lock
should lose nothing at any count, TF's single-kernel updates (scatters, fused) about nothing;
the unlocked update loses what overlapped, which grows with the updates a ps really runs at
the same moment, i.e. with its cores (TF's inter-op threads, one per core by default).

Each variant and updater count in its own process; the processes of one updater count run
one after another per round, the counts one after another. One timed request is --steps
updates per updater in one `tf.function` call each. Reported: updates/s, CPU ms per update and
the lost share, and (1 updater) how much less CPU the library's update takes than `scatters`:
a ps shares its cores with the other tasks, so its CPU, not its wall time, sets the cluster's
steps/s (BUILD.md: perf on the real cluster put TF's scatters at 36% of a ps's CPU). With one
updater the variants apply the same gradients in the same order, so their tables end equal.
"""

from __future__ import annotations

import statistics

from benchmarks import _bench

NAME = "sparse_update"
VARIANTS = ("sparse_adagrad", "sparse_adagrad_unlocked", "scatters", "fused")
RECIPE = f"{_bench.REPO}/configs/sharded_embedding/100m.gin"
LEARNING_RATE, EPSILON, INITIAL_ACCUMULATOR = 0.05, 1e-7, 0.1


def parse_args(argv):
    p = _bench.parser(
        NAME, __doc__, steps=300, repeats=3, warmup_steps=20, batch_size=1024, max_rows=10**9
    )
    p.add_argument("--num_ps", type=int, default=2, help="the update is ps:0's share of each table")
    p.add_argument(
        "--updaters",
        default="1,2,4",
        help="how many threads update the same tables at once: a process for each count and "
        "variant; 1 must be among them (the figure's)",
    )
    smoke = "--steps=5 --repeats=1 --warmup_steps=2 --batch_size=64 --max_rows=3000 --updaters=1,2"
    args = _bench.parse(p, argv, smoke, lists="updaters")
    if 1 not in args.updaters:
        p.error(f"--updaters needs 1 (the figure's count), got {args.updaters}")
    args.updaters = sorted(set(args.updaters))
    return args


def process_name(variant: str, updaters: int) -> str:
    """A variant's process: its name alone for one updater, ``<variant>@<n>`` for n."""
    return variant if updaters == 1 else f"{variant}@{updaters}"


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


def row_gains(ids, values):
    """What one table's update adds to its accumulator, in float64: its distinct rows and, for
    each, the gradient summed per row, squared, summed over the row."""
    import numpy as np

    rows, position = np.unique(ids, return_inverse=True)
    summed = np.zeros((len(rows), values.shape[1]), np.float64)
    np.add.at(summed, position, values.astype(np.float64))
    return rows, np.sum(summed**2, axis=1)


def expected_gains(batches, values, head) -> list[tuple[float, float]]:
    """Per batch, what its update adds to the accumulators, exactly: over all rows, and over the
    `head` rows (per table, those every batch updates)."""
    import numpy as np

    gains = []
    for ids, vals in zip(batches, values):
        every = only_head = 0.0
        for i, v, h in zip(ids, vals, head):
            rows, gain = row_gains(i, v)
            every += float(gain.sum())
            only_head += float(gain[np.isin(rows, h)].sum())
        gains.append((every, only_head))
    return gains


def lost_share(gained: float, expected: float) -> float | None:
    """1 - gained / expected: the share of the updates the accumulators miss (None: none due)."""
    return 1 - gained / expected if expected > 0 else None


def serve(args):
    import functools
    import threading

    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist_trainer import sharding, tf_compat
    from tfdist_trainer.sharding import update_lock

    variant, _, count = args.variant_process.partition("@")
    updaters = int(count or 1)
    rows, batches = shard_ids(args)
    rng = np.random.default_rng(args.seed)
    initial = [rng.standard_normal((r, 17), dtype=np.float32) for r in rows]
    values = [[rng.standard_normal((len(i), 17), dtype=np.float32) for i in b] for b in batches]
    gradients = [
        [tf.IndexedSlices(tf.constant(v), tf.constant(i, tf.int64)) for v, i in zip(vs, b)]
        for vs, b in zip(values, batches)
    ]
    # per table, the rows some batch updates (the only accumulator rows that change) and the rows
    # every batch updates (the small tables, the Zipf head: what concurrent updates all touch)
    touched = [np.unique(np.concatenate([b[t] for b in batches])) for t in range(len(rows))]
    head = [functools.reduce(np.intersect1d, [b[t] for b in batches]) for t in range(len(rows))]
    expected_gain = expected_gains(batches, values, head)

    # one trace for every batch, each with its own count of ids a table
    spec = tf.IndexedSlicesSpec([None, 17], tf.float32, tf.int64, None, [None])
    signature = [spec] * len(rows)

    if variant.startswith("sparse_adagrad"):
        optimizer = sharding.SparseAdagrad(
            LEARNING_RATE, initial_accumulator_value=INITIAL_ACCUMULATOR, epsilon=EPSILON
        )
        stored = [keras.Variable(t, name=f"table_{n}") for n, t in enumerate(initial)]
        if variant == "sparse_adagrad":  # what the library does under parameter_server
            for table in stored:
                update_lock.guard(table)
        optimizer.build(stored)
        accumulators = [tf_compat.adagrad_accumulator(optimizer, t) for t in stored]

        @tf.function(input_signature=[signature])
        def update(grads):
            optimizer.apply(grads, stored)

    else:
        stored = [tf.Variable(t) for t in initial]
        accumulators = [tf.Variable(tf.fill(t.shape, INITIAL_ACCUMULATOR)) for t in initial]

        @tf.function(input_signature=[signature])
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

    del initial  # the variables hold their copies

    def gain_of(selected: list) -> tf.Tensor:
        """What the accumulators' `selected` rows (per table) gained since they were made."""
        gains = [
            tf.reduce_sum(tf.cast(tf.gather(a, tf.constant(t, tf.int64)), tf.float64))
            - float(np.float32(INITIAL_ACCUMULATOR)) * t.size * 17
            for a, t in zip(accumulators, selected)
        ]
        return tf.add_n(gains)

    @tf.function
    def accumulator_gain():
        """What the accumulators gained since they were made, in float64: all rows, head rows."""
        return tf.stack([gain_of(touched), gain_of(head)])

    done = [0] * updaters  # each updater's updates so far
    total = np.zeros(2)  # what every update so far added, exactly: all rows, head rows

    def updater(k: int, steps: int, barrier, applied: list[int]) -> None:
        """Updater k of n applies its batches k, k+n, ... (as workers read batches of their own);
        `applied` (its own) counts them by batch."""
        barrier.wait()
        for _ in range(steps):
            batch = (k + done[k] * updaters) % len(gradients)
            update(gradients[batch])
            applied[batch] += 1
            done[k] += 1

    def run(steps: int) -> dict:
        before = accumulator_gain().numpy()
        barrier, applied = threading.Barrier(updaters), [[0] * len(gradients) for _ in done]
        threads = [
            threading.Thread(target=updater, args=(k, steps, barrier, applied[k]))
            for k in range(updaters)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        gained = accumulator_gain().numpy()
        expected = sum(n * np.array(g) for a in applied for n, g in zip(a, expected_gain))
        total[:] += expected
        return {
            # the tables after every update so far, for the parent to compare between variants
            "final_tables": " ".join(f"{float(tf.reduce_sum(tf.abs(t))):.6e}" for t in stored[:3]),
            "updates": sum(map(sum, applied)),
            "lost": lost_share(gained[0] - before[0], expected[0]),
            "lost_head": lost_share(gained[1] - before[1], expected[1]),
            # every update since the process started: the warm-up's and every request's
            "lost_since_start": lost_share(gained[0], total[0]),
        }

    update.get_concrete_function()  # traced before the threads start
    run.info = {
        "variant": variant,
        "updaters": updaters,
        "tables": len(rows),
        "rows": int(sum(rows)),
        "distinct_ids_per_update": float(np.mean([sum(len(i) for i in b) for b in batches])),
        "head_rows": int(sum(h.size for h in head)),
        "head_share_of_gain": float(np.mean([h / a for a, h in expected_gain])),
    }
    _bench.serve_variant(lambda: run, args.warmup_steps)


def measure(args, updaters: int) -> dict[str, dict]:
    """Every variant by `updaters` threads at once, a process each: their results by name."""
    names = [process_name(variant, updaters) for variant in VARIANTS]
    with _bench.Variants(args, names) as v:
        v.time(args.steps, args.repeats)
    results = {}
    for name in names:
        runs, updates = v.runs[name], args.steps * updaters
        rates = [updates / r["seconds"] for r in runs]
        lost = [r["result"]["lost"] for r in runs]
        lost_head = [r["result"]["lost_head"] for r in runs if r["result"]["lost_head"] is not None]
        results[name] = v.result(
            name,
            final_tables=v.last[name]["final_tables"],
            updates_per_request=updates,
            updates_per_s=statistics.median(rates),
            updates_per_s_min=min(rates),
            updates_per_s_max=max(rates),
            # on a ps the cores are shared with the other tasks: its CPU per update is what counts
            cpu_runs_s=[r["user_s"] + r["sys_s"] for r in runs],
            cpu_ms_per_update=statistics.median(r["user_s"] + r["sys_s"] for r in runs)
            * 1e3
            / updates,
            lost_updates=statistics.median(lost),
            lost_updates_min=min(lost),
            lost_updates_max=max(lost),
            lost_updates_runs=lost,
            lost_head_updates=statistics.median(lost_head) if lost_head else None,
            lost_head_updates_min=min(lost_head, default=None),
            lost_head_updates_max=max(lost_head, default=None),
            lost_head_updates_runs=lost_head,
            lost_updates_since_start=v.last[name]["lost_since_start"],
        )
    results["environment"] = v.environment()
    return results


def lost_cell(result: dict, key: str) -> str:
    """A lost share's median and min..max, in percent ('-' where no update was due)."""
    if result[key] is None:
        return "-"
    low, high = (round(100 * result[f"{key}_{end}"], 2) + 0.0 for end in ("min", "max"))
    return f"{round(100 * result[key], 2) + 0.0:.2f}% ({low:.2f}..{high:.2f})"


def run(args):
    results: dict[str, dict] = {}
    for updaters in args.updaters:
        results.update(measure(args, updaters))
    environment = results.pop("environment")
    one = {variant: results[variant] for variant in VARIANTS}  # the 1-updater processes
    _bench.add_ratios(one, {n: r["times_s"] for n, r in one.items()}, "scatters")
    library = results["sparse_adagrad"]
    cpu = {name: r["cpu_runs_s"] for name, r in one.items()}
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
        [
            variant,
            str(updaters),
            *_bench.rate_cells(r, unit="updates_per_s"),
            f"{r['cpu_ms_per_update']:.2f}",
            lost_cell(r, "lost_updates"),
            lost_cell(r, "lost_head_updates"),
        ]
        for variant in VARIANTS
        for updaters in args.updaters
        for r in [results[process_name(variant, updaters)]]
    ]
    unlocked = results["sparse_adagrad_unlocked"]
    notes = [
        "lost: the share of the updates the accumulators miss (1 - their gain / the exact sum of "
        "the squared per-row gradients the updaters applied), per request; head rows: the "
        f"{library['head_rows']:,} rows every batch updates (the small tables, the Zipf head; "
        f"{library['head_share_of_gain']:.1%} of an update's gain), which concurrent updates all "
        "touch",
        f"the lock at 1 updater: {library['cpu_ms_per_update']:.2f} CPU ms an update against "
        f"{unlocked['cpu_ms_per_update']:.2f} without it",
    ]
    _bench.record(
        args,
        header=f"{environment['cpu_count']} cores; ps:0 of {args.num_ps}: {library['tables']} "
        f"shards, {library['rows']:,} rows x 17 floats, {library['distinct_ids_per_update']:,.0f} "
        f"distinct ids an update (batch {args.batch_size}); {args.steps} updates per updater x "
        f"{args.repeats} (median, min..max)",
        columns=[
            "variant",
            "updaters",
            "updates/s",
            "min..max",
            "CPU ms / update",
            "lost (min..max)",
            "lost, head rows",
        ],
        rows=rows,
        notes=notes,
        environment=environment,
        baseline="scatters",
        results=results,
        figures=[figure],
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
