"""mirrored on logical CPUs against one_device: the same model, data and global batch.

Both variants are what `tfdist-train` runs (build_run), each in its own process; mirrored splits
the CPU into --num_logical_cpus devices as the strategy does without a GPU. Logical CPUs share
one thread pool, so this is what mirrored costs or gains on a CPU-only host.
"""

from __future__ import annotations

from benchmarks import _bench

NAME = "mirrored_vs_one_device"
VARIANTS = ("one_device", "mirrored")  # the baseline first


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, model=True, steps=300, repeats=5, warmup_steps=100)
    p.add_argument("--steps_per_loop", type=int, default=100)
    p.add_argument("--num_logical_cpus", type=int, default=2)
    smoke = "--steps=20 --repeats=1 --warmup_steps=10 --steps_per_loop=10 --filters=4,8 "
    args = _bench.parse(p, argv, smoke + "--dense_units=16 --batch_size=16")
    if args.num_logical_cpus < 2 or args.batch_size % args.num_logical_cpus:
        p.error("--num_logical_cpus must be >= 2 and divide --batch_size")
    return args


def serve(args):
    from tfdist_trainer.plan.strategies import Mirrored, OneDevice

    pool = _bench.load_pool(args)
    if args.variant_process == "mirrored":
        strategy = Mirrored(num_logical_cpus=args.num_logical_cpus)
    else:
        strategy = OneDevice(device="/cpu:0")

    def build():
        import tensorflow as tf

        trainer = _bench.mnist_trainer(args, pool)
        spl = args.steps_per_loop
        run = _bench.library_run(trainer, strategy, steps_per_loop=spl, seed=args.seed)
        replicas = run.runtime.strategy.num_replicas_in_sync
        runner = _bench.steps_runner(run)
        runner.info = {
            "replicas": replicas,
            "per_replica_batch": args.batch_size // replicas,
            "devices": [d.name for d in tf.config.list_logical_devices("CPU")],
        }
        return runner

    _bench.serve_variant(build, args.warmup_steps)


def run(args):
    with _bench.Variants(args, VARIANTS) as v:
        times = v.time(args.steps, args.repeats)
    results = {name: v.result(name) for name in VARIANTS}
    _bench.add_ratios(results, times, "one_device")
    for r in results.values():
        r["examples_per_s"] = r["steps_per_s"] * args.batch_size
    mirrored = results["mirrored"]
    fig = _bench.figure(
        f"mirrored on {args.num_logical_cpus} logical CPUs, examples/s",
        mirrored["examples_per_s"],
        "examples/s",
        "one_device (same global batch)",
        mirrored["speedup_vs_baseline"],
        "speedup",
        args.repeats,
        mirrored["speedup_vs_baseline_paired"],
    )
    rows = [
        [n, r["replicas"], *_bench.rate_cells(r), f"{r['examples_per_s']:,.0f}"]
        for n, r in results.items()
    ]
    _bench.record(
        args,
        header=f"global batch {args.batch_size}, {args.steps} steps x {args.repeats} (median)",
        columns=["variant", "replicas", *_bench.RATE_COLUMNS, "examples/s"],
        rows=rows,
        environment=v.environment(),
        devices=mirrored["devices"],
        baseline="one_device",
        results=results,
        figures=[fig],
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
