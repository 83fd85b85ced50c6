"""Sharded tables under parameter_server: one lookup per shard (today) against one per ps.

Issue 39's open question: what does a step of many sharded tables cost on the ps, and does
stacking a ps's shards pay? Both variants look up the same `sharding.ShardedEmbedding` tables
(`--tables` x `--num_ps` shards, `--rows` x `--dim`, `--batch` ids per table, the same seeded
ids), then a linear head and a squared loss, and update the tables by plain sparse SGD on the ps:

  per_shard     what the library does today: `layer(ids)` under the tape, one gather per shard;
                autodiff sends each shard's gradient to its ps on its own
  stacked_rows  per ps, one tensor of all its shards' ids (and one of their sizes) to the ps and
                one tensor of rows back, looked up outside the tape; the gradient is taken with
                respect to those rows (one tensor per ps) and split into each shard's rows on
                the ps, as TPU embeddings apply theirs (the study, written out here)
  group         the same through the library, as the Trainer's step does it: the tables in one
                `sharding.EmbeddingGroup`, the gradient taken by `row_gradients.recording`

Each variant runs in its own process on in-process servers (chief, 1 worker, --num_ps ps) with a
ParameterServerStrategy and its ClusterCoordinator, one closure per step. The process's CPU is
the whole cluster's. Both update the same rows by the same amounts, so their losses agree.
"""

from __future__ import annotations

from benchmarks import _bench

NAME = "stacked_lookup"
VARIANTS = ("per_shard", "stacked_rows", "group")  # the baseline first
LEARNING_RATE = 0.01
ID_BATCHES = 8  # distinct batches of ids, cycled


def parse_args(argv):
    p = _bench.parser(
        NAME, __doc__, steps=200, repeats=3, warmup_steps=20, tables=26, rows=100_000, dim=17
    )
    p.add_argument("--batch", type=int, default=1024, help="ids per table per step")
    p.add_argument("--num_ps", type=int, default=2)
    smoke = "--steps=10 --repeats=1 --warmup_steps=3 --tables=3 --rows=500 --dim=4 --batch=32"
    args = _bench.parse(p, argv, smoke)
    if args.rows < args.num_ps:
        p.error(f"--rows={args.rows} gives some of the --num_ps={args.num_ps} shards no row")
    return args


def _cluster(num_ps: int):
    """A ParameterServerStrategy and its ClusterCoordinator on in-process servers."""
    import tensorflow as tf

    from tfdist_trainer.launch.ports import pick_port

    jobs = {"chief": 1, "worker": 1, "ps": num_ps}
    spec = tf.train.ClusterSpec(
        {job: [f"localhost:{pick_port()}" for _ in range(n)] for job, n in jobs.items()}
    )
    servers = [
        tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
        for job in ("worker", "ps")
        for i in range(jobs[job])
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy), servers


def _apply_sgd(gradients, variables, head):
    """Sparse SGD of each shard on its ps (the tables' IndexedSlices), then of the head."""
    import tensorflow as tf

    for gradient, variable in zip(gradients[:-1], variables):
        with tf.device(variable.device):
            variable.scatter_sub(
                tf.IndexedSlices(LEARNING_RATE * gradient.values, gradient.indices)
            )
    head.assign_sub(LEARNING_RATE * gradients[-1])


def _per_shard_step(tables, head, variables):
    """Today's path: the tape differentiates each shard's gather."""
    import tensorflow as tf

    def step(ids):
        with tf.GradientTape() as tape:
            rows = [table(i) for table, i in zip(tables, ids)]
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.concat(rows, 1), head)))
        _apply_sgd(tape.gradient(loss, variables + [head]), variables, head)
        return loss

    return step


def _stacked_rows_step(tables, head):
    """One ids tensor and one rows tensor per ps; the gradient of each ps's rows split on the ps."""
    import tensorflow as tf

    weights = [table.sharded_table for table in tables]
    ps_devices = sorted({v.device for w in weights for v in w.tf_variables()})

    def step(ids):
        per_table = []  # (restore, shard positions, shard local ids) of each table
        for weight, table_ids in zip(weights, ids):
            flat, restore = tf.unique(tf.cast(table_ids, tf.int64))
            shard, local = weight.layout.assign(flat)
            shard = tf.cast(shard, tf.int32)
            n = weight.layout.num_shards
            positions = tf.dynamic_partition(tf.range(tf.size(flat)), shard, n)
            per_table.append((restore, positions, tf.dynamic_partition(local, shard, n)))
        on_device = {d: [] for d in ps_devices}  # device -> [(table, shard)]
        for t, weight in enumerate(weights):
            for s, variable in enumerate(weight.tf_variables()):
                on_device[variable.device].append((t, s))
        with tf.GradientTape() as tape:
            stacked, parts = {}, [dict() for _ in weights]
            for device, members in on_device.items():
                local_ids = [per_table[t][2][s] for t, s in members]
                sizes = tf.stack([tf.size(i) for i in local_ids])
                flat_ids = tf.concat(local_ids, 0)
                with tape.stop_recording(), tf.device(device):
                    pieces = tf.split(flat_ids, sizes, num=len(members))
                    rows = tf.concat(
                        [
                            tf.gather(weights[t].tf_variables()[s], piece)
                            for (t, s), piece in zip(members, pieces)
                        ],
                        0,
                    )
                tape.watch(rows)
                stacked[device] = (rows, sizes, flat_ids)
                for (t, s), part in zip(members, tf.split(rows, sizes, num=len(members))):
                    parts[t][s] = part
            looked_up = [
                tf.gather(
                    tf.dynamic_stitch(per_table[t][1], [parts[t][s] for s in range(len(parts[t]))]),
                    per_table[t][0],
                )
                for t in range(len(weights))
            ]
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.concat(looked_up, 1), head)))
        gradients = tape.gradient(loss, [stacked[d][0] for d in ps_devices] + [head])
        for device, gradient in zip(ps_devices, gradients[:-1]):
            _, sizes, flat_ids = stacked[device]
            members = on_device[device]
            with tf.device(device):
                row_gradients = tf.split(gradient, sizes, num=len(members))
                row_ids = tf.split(flat_ids, sizes, num=len(members))
                for (t, s), g, i in zip(members, row_gradients, row_ids):
                    weights[t].tf_variables()[s].scatter_sub(tf.IndexedSlices(LEARNING_RATE * g, i))
        head.assign_sub(LEARNING_RATE * gradients[-1])
        return loss

    return step


def _group_step(group, head):
    """The library's path: an EmbeddingGroup read inside `row_gradients.recording`."""
    import tensorflow as tf

    from tfdist_trainer import row_gradients, tf_compat

    variables = [v for table in group.tables for v in table.sharded_table.variables]

    def step(ids):
        with tf.GradientTape() as tape, row_gradients.recording(tape) as recorded:
            rows = group(ids)
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.concat(rows, 1), head)))
        gradients = recorded.gradient(loss, variables + [head])
        _apply_sgd(gradients, [tf_compat.variable_storage(v) for v in variables], head)
        return loss

    return step


def serve(args):
    def build():
        import tensorflow as tf

        from tfdist_trainer import sharding

        strategy, coordinator, servers = _cluster(args.num_ps)
        with strategy.scope():
            tables = [
                sharding.ShardedEmbedding(
                    args.rows,
                    args.dim,
                    num_shards=args.num_ps,
                    embeddings_initializer=tf.keras.initializers.RandomNormal(seed=t),
                )
                for t in range(args.tables)
            ]
            for table in tables:
                table.build()
            head = tf.Variable(
                tf.random.stateless_normal([args.tables * args.dim, 1], seed=[args.seed, 1]) * 0.1
            )
            group = sharding.EmbeddingGroup(tables)
            group.build()
        variables = [v for table in tables for v in table.sharded_table.tf_variables()]
        if args.variant_process == "per_shard":
            step = tf.function(_per_shard_step(tables, head, variables))
        elif args.variant_process == "group":
            step = tf.function(_group_step(group, head))
        else:
            step = tf.function(_stacked_rows_step(tables, head))
        pool = [
            [
                tf.random.stateless_uniform(
                    [args.batch], [args.seed, b * 1000 + t], 0, args.rows, tf.int64
                )
                for t in range(args.tables)
            ]
            for b in range(ID_BATCHES)
        ]
        done = [0]

        def run(steps: int) -> float:
            loss = None
            for _ in range(steps):
                loss = coordinator.schedule(step, args=(pool[done[0] % ID_BATCHES],))
                done[0] += 1
            coordinator.join()
            return float(loss.fetch())

        run.info = {"shards": len(variables), "ps_devices": sorted({v.device for v in variables})}
        run.servers = servers  # the in-process cluster lives as long as the variant's runner
        return run

    _bench.serve_variant(build, args.warmup_steps)


def run(args):
    with _bench.Variants(args, VARIANTS) as v:
        times = v.time(args.steps, args.repeats)
    results = {name: v.result(name, final_loss=v.last[name]) for name in VARIANTS}
    _bench.add_ratios(results, times, "per_shard")
    stacked = results["group"]  # what the library gives a Trainer
    fig = _bench.figure(
        f"{args.tables} tables x {args.num_ps} shards in an EmbeddingGroup (one read per ps), steps/s",
        stacked["steps_per_s"],
        "steps/s",
        "per_shard (one lookup per shard, same run)",
        stacked["speedup_vs_baseline"],
        "speedup",
        args.repeats,
        stacked["speedup_vs_baseline_paired"],
    )
    rows = [
        [
            n,
            r["shards"],
            *_bench.rate_cells(r),
            f"{r['user_ms_per_step'] + r['sys_ms_per_step']:.1f}",
            f"{r['final_loss']:.6g}",
        ]
        for n, r in results.items()
    ]
    _bench.record(
        args,
        header=(
            f"{args.tables} tables of {args.rows:,} x {args.dim} on {args.num_ps} ps, "
            f"{args.batch} ids per table, {args.steps} steps x {args.repeats} (median)"
        ),
        columns=[
            "variant",
            "shards",
            *_bench.RATE_COLUMNS,
            "cluster CPU ms / step",
            "loss after",
        ],
        rows=rows,
        environment=v.environment(),
        baseline="per_shard",
        results=results,
        figures=[fig],
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
