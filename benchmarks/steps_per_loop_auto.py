"""`train.steps_per_loop = 'auto'` against fixed values, one_device, the MNIST recipe's model.

Every variant is what `tfdist-train` runs (build_run), each in its own process: the fixed ones
with ``steps_per_loop = K``, `auto` with the tuner 'auto' gives, tuned untimed first (the search
a user pays once per run; its cost is reported as tuning_s). A timed repetition is one
``run.train(--steps)`` call (a log interval). Target: auto within 10% of the best fixed value.
"""

from __future__ import annotations

import time

from benchmarks import _bench

NAME = "steps_per_loop_auto"


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, model=True, steps=1000, repeats=5, warmup_steps=200)
    p.add_argument("--fixed", default="1,10,100,1000", help="fixed steps_per_loop values")
    p.add_argument("--max_tuning_steps", type=int, default=20000, help="cap on auto's search")
    smoke = "--fixed=1,10 --steps=40 --repeats=1 --warmup_steps=10 --max_tuning_steps=400 "
    smoke += "--filters=4,8 --dense_units=16 --batch_size=16"
    return _bench.parse(p, argv, smoke, lists="fixed")


def variants(args) -> dict[str, int | str]:
    return {f"fixed_{k}": k for k in args.fixed} | {"auto": "auto"}


def serve(args):
    from tfdist_trainer.plan.strategies import OneDevice

    pool, size = _bench.load_pool(args), variants(args)[args.variant_process]

    def build():
        trainer = _bench.mnist_trainer(args, pool)
        run = _bench.steps_runner(
            _bench.library_run(trainer, OneDevice(), steps_per_loop=size, seed=args.seed)
        )
        loop, run.info = run.run.loop, {}
        if size == "auto":
            done, t0 = 0, time.perf_counter()
            while not loop.size.frozen and done < args.max_tuning_steps:
                run(args.steps)
                done += args.steps
            tuning = {"tuning_steps": done, "tuning_s": time.perf_counter() - t0}
            run.info = {**tuning, "settled": loop.size.frozen}
        run.info["steps_per_loop"] = loop.steps_per_loop
        return run

    _bench.serve_variant(build, args.warmup_steps)


def run(args):
    with _bench.Variants(args, list(variants(args))) as v:
        times = v.time(args.steps, args.repeats)
    results = {name: v.result(name) for name in variants(args)}
    best = max((n for n in results if n != "auto"), key=lambda n: results[n]["steps_per_s"])
    auto = results["auto"]
    ratio = auto["steps_per_s"] / results[best]["steps_per_s"]
    fig = _bench.figure(
        f"steps_per_loop='auto' (settled on {auto['steps_per_loop']}), one_device",
        auto["steps_per_s"],
        "steps/s",
        f"best fixed value ({results[best]['steps_per_loop']}) of {args.fixed}",
        ratio,
        "relative speed",
        args.repeats,
        _bench.ratio_spread(times[best], times["auto"]),
        ">= 0.9",
    )
    rows = [[n, r["steps_per_loop"], *_bench.rate_cells(r)] for n, r in results.items()]
    note = (
        f"auto settled on {auto['steps_per_loop']} after {auto['tuning_steps']} untimed steps "
        f"({auto['tuning_s']:.1f}s{'' if auto['settled'] else ', NOT settled'})"
    )
    _bench.record(
        args,
        header=f"one_device, {args.steps} steps per train() call x {args.repeats} (median, min..max)",
        columns=["variant", "steps_per_loop", *_bench.RATE_COLUMNS],
        rows=rows,
        notes=[note],
        environment=v.environment(),
        baseline="best fixed steps_per_loop",
        results=results,
        summary={"best_fixed": best, "auto_over_best_fixed": ratio},
        figures=[fig],
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
