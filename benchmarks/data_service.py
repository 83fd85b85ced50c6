"""parameter_server input: the tf.data service (parameter_server.data_service) vs static shards.

Each variant is a whole job started as a user starts it (``tfdist-launch --num_workers=N
--num_ps=1``, MNIST digits), the variants interleaved over the repetitions. A job's speed is
steps/s between its first and last train records past --warmup_steps (metrics.jsonl).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

from benchmarks import _bench

NAME = "data_service"
VARIANTS = ("static", "served")  # the baseline first


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, steps=1500, repeats=3, warmup_steps=200, num_workers=2)
    p.add_argument("--timeout_s", type=float, default=600.0, help="limit per job")
    return _bench.parse(p, argv, "--steps=120 --warmup_steps=40 --repeats=1")


def job_steps_per_s(args, variant: str, model_dir: str) -> float:
    cmd = [sys.executable, "-m", "tfdist_trainer.launch.main", f"--num_workers={args.num_workers}"]
    cmd += ["--num_ps=1", "--", f"--model_dir={model_dir}"]
    cmd += [
        f"--gin_file={_bench.REPO}/configs/{g}.gin"
        for g in ("mnist", "strategies/parameter_server")
    ]
    bindings = [
        "MnistTrainer.data_source='digits'",
        f"train.train_steps={args.steps}",
        "train.log_every_n_steps=20",
        "train.eval_every_n_steps=None",
        f"parameter_server.data_service={variant == 'served'}",
    ]
    cmd += [f"--gin_bindings={b}" for b in bindings]
    return _bench.launched_job_steps_per_s(
        variant, cmd, model_dir, args.warmup_steps, args.timeout_s
    )


def run(args):
    speeds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-data-service-") as work_dir:
        for rep in range(args.repeats):
            for v in VARIANTS:
                speeds[v].append(job_steps_per_s(args, v, os.path.join(work_dir, f"{v}{rep}")))
    results = {
        v: {
            "steps_per_s": statistics.median(s),
            "steps_per_s_min": min(s),
            "steps_per_s_max": max(s),
            "runs": s,
        }
        for v, s in speeds.items()
    }
    ratios = _bench.ratio_spread(speeds["served"], speeds["static"])
    results["served"]["ratio_to_static"] = ratios["median"]
    fig = _bench.figure(
        "served input: steps/s",
        results["served"]["steps_per_s"],
        "steps/s",
        "static shards (same run)",
        ratios["median"],
        "served / static, steps/s",
        args.repeats,
        ratios,
    )
    rows = [
        [v, *_bench.rate_cells(r), f"{r.get('ratio_to_static', 1.0):.2f}"]
        for v, r in results.items()
    ]
    _bench.record(
        args,
        header=f"parameter_server MNIST digits, {args.num_workers} workers + 1 ps, {args.steps} "
        f"steps per job, speed past step {args.warmup_steps}, {args.repeats} repetition(s)",
        columns=["input", *_bench.RATE_COLUMNS, "x static"],
        rows=rows,
        environment=_bench.environment(),
        baseline="static",
        results=results,
        figures=[fig],
    )


if __name__ == "__main__":
    _bench.main(parse_args, None, run)
