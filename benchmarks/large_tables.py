"""Large tables under every strategy: the click model's steps/s against one_device's.

Each variant is a whole job started as a user starts it (``tfdist-launch``), the variants
interleaved over the repetitions: the sharded-embedding recipe at the Kaggle Criteo
cardinalities (configs/sharded_embedding/100m.gin) capped at --max_rows rows per table,
SparseAdagrad, the same global batch for every variant. A job's speed is steps/s between its
first and last train records past --warmup_steps (metrics.jsonl).

Issue 36's target: multi_worker_mirrored with 2 workers >= 0.5x one_device's steps/s on the
same cores (before its lookups read only the batch's rows: 0.02-0.1x).
"""

from __future__ import annotations

import os
import tempfile

from benchmarks import _bench

NAME = "large_tables"
#: variant: (launcher flags, strategy gin file); one_device, the baseline, first.
VARIANTS = {
    "one_device": ([], "one_device"),
    "multi_worker_mirrored": (["--num_workers=2"], "multi_worker_mirrored"),
    "parameter_server": (["--num_workers=2", "--num_ps=2"], "parameter_server"),
}
BASELINE = "one_device"
#: The 26 Kaggle Criteo cardinalities (100m.gin scales them down to 5.88 M rows).
CRITEO_ROWS = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)


def parse_args(argv):
    p = _bench.parser(
        NAME,
        __doc__,
        steps=300,
        repeats=2,
        warmup_steps=100,
        batch_size=512,
        max_rows=1_000_000,
        embedding_dim=16,
    )
    p.add_argument("--timeout_s", type=float, default=900.0, help="limit per job")
    p.add_argument("--only", default="", help="comma-separated variants (default: all)")
    return _bench.parse(
        p, argv, "--steps=60 --warmup_steps=20 --repeats=1 --max_rows=20000 --batch_size=128"
    )


def vocab_sizes(max_rows: int) -> list[int]:
    return [min(rows, max_rows) for rows in CRITEO_ROWS]


def job_steps_per_s(args, variant: str, model_dir: str) -> float:
    launch_flags, strategy = VARIANTS[variant]
    bindings = [
        f"ClickTrainer.vocab_sizes={vocab_sizes(args.max_rows)}",
        f"ClickTrainer.embedding_dim={args.embedding_dim}",
        f"Trainer.global_batch_size={args.batch_size}",
        f"train.train_steps={args.steps}",
        "train.log_every_n_steps=20",
        "train.eval_every_n_steps=None",
        "train.checkpoint_every_n_steps=None",
    ]
    gin_files = ["sharded_embedding/100m.gin", f"strategies/{strategy}.gin"]
    cmd = _bench.launch_command(launch_flags, model_dir, gin_files, bindings)
    return _bench.launched_job_steps_per_s(
        variant, cmd, model_dir, args.warmup_steps, args.timeout_s
    )


def run(args):
    chosen = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    if BASELINE not in chosen:
        chosen.insert(0, BASELINE)
    speeds: dict[str, list[float]] = {v: [] for v in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-large-tables-") as work_dir:
        for rep in range(args.repeats):
            for v in chosen:
                speed = job_steps_per_s(args, v, os.path.join(work_dir, f"{v}{rep}"))
                print(f"[bench] {v} repetition {rep + 1}: {speed:.2f} steps/s", flush=True)
                speeds[v].append(speed)
    results = _bench.rate_results(speeds)
    figures = []
    for v in chosen:
        ratios = _bench.ratio_spread(speeds[v], speeds[BASELINE])
        results[v]["ratio_to_one_device"] = ratios["median"]
        if v == "multi_worker_mirrored":
            figures.append(
                _bench.figure(
                    "multi_worker_mirrored (2 workers): steps/s",
                    results[v]["steps_per_s"],
                    "steps/s",
                    "one_device (same run)",
                    ratios["median"],
                    "multi_worker_mirrored / one_device, steps/s",
                    args.repeats,
                    ratios,
                    target=">= 0.5",
                    key="issue36_mwms_vs_one_device",
                )
            )
    rows = [
        [v, *_bench.rate_cells(r, ".2f"), f"{r['ratio_to_one_device']:.2f}"]
        for v, r in results.items()
    ]
    rows_total = sum(vocab_sizes(args.max_rows))
    _bench.record(
        args,
        header=f"click model, 26 tables at Criteo cardinalities capped at {args.max_rows:,} rows "
        f"({rows_total:,} rows x {1 + args.embedding_dim} floats), SparseAdagrad, global batch "
        f"{args.batch_size}, {args.steps} steps per job, speed past step {args.warmup_steps}, "
        f"{args.repeats} repetition(s)",
        columns=["strategy", *_bench.RATE_COLUMNS, "x one_device"],
        rows=rows,
        environment=_bench.environment(),
        baseline=BASELINE,
        results=results,
        figures=figures,
    )


if __name__ == "__main__":
    _bench.main(parse_args, None, run)
