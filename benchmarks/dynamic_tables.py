"""Tables that grow against fixed, bucket-hashed tables at the same memory, on the same data.

The click model (configs/sharded_embedding/dynamic.gin) on the synthetic open id space: raw
64-bit ids, per feature a Zipf-like head and a long tail of new ids seen about once. Two kinds
of tables, the same rows per table (the Criteo cardinalities capped to [--min_rows, --max_rows];
the data's head has as many ids), 2 shards each, SparseAdagrad, the same global batch:

- fixed: `ShardedEmbedding` of that many rows, each raw id hashed into them (`BucketHash`: a
  FarmHash fingerprint mod the rows; distinct ids may share a row);
- dynamic: the features' `DynamicEmbedding`s stacked as one (dynamic.gin's
  ``stacked_tables``: each feature its own key space, their capacities summed; every admitted id
  a row of its own, min_count sightings first, LFU eviction when full), one hash-table step per
  shard per training step;
- dynamic_per_table: one `DynamicEmbedding` per feature of that capacity (a hash-table step per
  table and shard: 26 x the graph of one, the cost of many small tables).

Each variant is a whole job started as a user starts it (``tfdist-launch``), one_device and
parameter_server (2 workers, 2 ps), the variants interleaved over the repetitions (--smoke: the
one_device jobs at once). A job's speed is its examples/s between its first and last train
records past --warmup_steps (metrics.jsonl); its AUC is the final evaluation's, on held-out
batches (the same head, tail ids no training batch drew); the dynamic tables' rows_in_use /
admitted / evicted / expired are its last train record's, summed over the tables.

Issue 37's target: dynamic >= 0.7x the fixed tables' examples/s.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor

from benchmarks import _bench
from benchmarks.large_tables import CRITEO_ROWS

NAME = "dynamic_tables"
TABLES = ("fixed", "dynamic", "dynamic_per_table")
BASELINE = "fixed"
#: strategy: (launcher flags, strategy gin file)
STRATEGIES = {
    "one_device": ([], "one_device"),
    "parameter_server": (["--num_workers=2", "--num_ps=2"], "parameter_server"),
}
COUNTERS = ("rows_in_use", "admitted", "evicted", "expired")
_COUNTER = re.compile(r"^(?:table_\d+|tables)/(" + "|".join(COUNTERS) + ")$")


def parse_args(argv):
    p = _bench.parser(
        NAME,
        __doc__,
        steps=400,
        repeats=2,
        warmup_steps=100,
        batch_size=512,
        min_rows=8192,
        max_rows=50_000,
        num_tables=26,
        embedding_dim=16,
        min_count=2,
        eval_batches=20,
        log_every=20,
    )
    p.add_argument("--timeout_s", type=float, default=900.0, help="limit per job")
    p.add_argument(
        "--strategies", default=",".join(STRATEGIES), help=f"comma-separated, of {list(STRATEGIES)}"
    )
    args = _bench.parse(
        p,
        argv,
        "--steps=30 --warmup_steps=10 --log_every=5 --repeats=1 --min_rows=1024 --max_rows=2048 "
        "--batch_size=64 --num_tables=2 --embedding_dim=4 --eval_batches=1 --strategies=one_device",
    )
    args.strategies = [s for s in args.strategies.replace(" ", "").split(",") if s]
    unknown = sorted(set(args.strategies) - set(STRATEGIES))
    if unknown or not args.strategies:
        p.error(f"--strategies: unknown {unknown or 'none given'}; choose from {list(STRATEGIES)}")
    if args.min_rows > args.max_rows:
        p.error(f"--min_rows={args.min_rows} is above --max_rows={args.max_rows}")
    if args.num_tables > len(CRITEO_ROWS):
        p.error(f"--num_tables must be at most {len(CRITEO_ROWS)}, got {args.num_tables}")
    return args


def table_rows(args) -> list[int]:
    """Rows of each table, fixed and dynamic alike: the data's head ids per feature too."""
    return [min(max(rows, args.min_rows), args.max_rows) for rows in CRITEO_ROWS[: args.num_tables]]


def job(args, variant: str, model_dir: str) -> dict:
    """One whole job of `variant` ('<strategy>/<tables>'): its speed, AUC and table counters."""
    strategy, tables = variant.split("/")
    launch_flags, strategy_gin = STRATEGIES[strategy]
    rows = table_rows(args)
    bindings = [
        f"ClickTrainer.vocab_sizes={rows}",
        f"ClickTrainer.dynamic_capacity={None if tables == 'fixed' else rows}",
        f"ClickTrainer.stacked_tables={tables == 'dynamic'}",
        "ClickTrainer.num_shards=2",
        f"ClickTrainer.embedding_dim={args.embedding_dim}",
        f"ClickTrainer.min_count={args.min_count}",
        f"ClickTrainer.eval_batches={args.eval_batches}",
        f"ClickTrainer.synthetic_seed={args.seed}",
        f"Trainer.global_batch_size={args.batch_size}",
        f"Trainer.eval_batch_size={args.batch_size}",
        f"train.train_steps={args.steps}",
        f"train.log_every_n_steps={args.log_every}",
        "train.eval_every_n_steps=None",  # one evaluation, at the end
        "train.checkpoint_every_n_steps=None",
    ]
    gin_files = ["sharded_embedding/dynamic.gin", f"strategies/{strategy_gin}.gin"]
    cmd = _bench.launch_command(launch_flags, model_dir, gin_files, bindings)
    records = _bench.launched_job_records(variant, cmd, model_dir, args.timeout_s)
    steps_per_s = _bench.records_steps_per_s(records, args.warmup_steps, model_dir)
    evals = [r for r in records if r.get("kind") == "eval" and "eval_auc" in r]
    if not evals:
        raise RuntimeError(f"{variant}: no evaluation with an AUC in {model_dir}/metrics.jsonl")
    last = [r for r in records if r.get("kind") == "train"][-1]
    counters = dict.fromkeys(COUNTERS, 0)
    for key, value in last.items():
        match = _COUNTER.match(key)
        if match:
            counters[match.group(1)] += int(value)
    return {
        "examples_per_s": steps_per_s * args.batch_size,
        "auc": evals[-1]["eval_auc"],
        "tables": None if tables == "fixed" else counters,
    }


def run(args):
    chosen = [f"{s}/{t}" for s in args.strategies for t in TABLES]
    runs: dict[str, list[dict]] = {v: [] for v in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-dynamic-tables-") as work_dir:

        def one(rep: int, variant: str) -> dict:
            return job(args, variant, os.path.join(work_dir, variant.replace("/", "-") + str(rep)))

        for rep in range(args.repeats):
            first = TABLES if rep % 2 == 0 else TABLES[::-1]  # each kind first in turn
            order = [f"{s}/{t}" for s in args.strategies for t in first]
            if args.smoke:  # tiny jobs of one process each: all at once (mostly TF starting)
                with ThreadPoolExecutor(len(order)) as pool:
                    done = dict(zip(order, pool.map(one, [rep] * len(order), order)))
            else:
                done = {v: one(rep, v) for v in order}
            for v in order:
                runs[v].append(done[v])
                r = done[v]
                print(
                    f"[bench] {v} repetition {rep + 1}: {r['examples_per_s']:,.0f} examples/s, "
                    f"AUC {r['auc']:.4f}" + (f", {r['tables']}" if r["tables"] else ""),
                    flush=True,
                )
    unit = "examples_per_s"
    results = _bench.rate_results({v: [r[unit] for r in runs[v]] for v in chosen}, unit)
    figures, rows = [], []
    for v in chosen:
        strategy, tables = v.split("/")
        base = f"{strategy}/{BASELINE}"
        ratios = _bench.ratio_spread([r[unit] for r in runs[v]], [r[unit] for r in runs[base]])
        aucs = [r["auc"] for r in runs[v]]
        results[v].update(
            ratio_to_fixed=ratios["median"],
            auc=statistics.median(aucs),
            aucs=aucs,
            tables=runs[v][-1]["tables"],
        )
        if tables == "dynamic":  # the figures of the recipe's layout (stacked)
            figures.append(
                _bench.figure(
                    f"{strategy}, dynamic tables (stacked): examples/s",
                    results[v][unit],
                    "examples/s",
                    f"{base} (same run, same rows)",
                    ratios["median"],
                    "dynamic / fixed tables, examples/s",
                    args.repeats,
                    ratios,
                    target=">= 0.7",
                    key=f"issue37_dynamic_vs_fixed_{strategy}",
                )
            )
            auc_ratios = _bench.ratio_spread(aucs, [r["auc"] for r in runs[base]])
            figures.append(
                _bench.figure(
                    f"{strategy}, dynamic tables (stacked): held-out AUC",
                    results[v]["auc"],
                    "AUC",
                    f"{base} (same run, same rows)",
                    auc_ratios["median"],
                    "dynamic / fixed tables, AUC",
                    args.repeats,
                    auc_ratios,
                    key=f"issue37_dynamic_vs_fixed_auc_{strategy}",
                )
            )
        counts = results[v]["tables"] or {}
        rows.append(
            [
                v,
                *_bench.rate_cells(results[v], ".0f", unit),
                f"{results[v]['ratio_to_fixed']:.2f}",
                f"{results[v]['auc']:.4f}",
                *(f"{counts[c]:,}" if counts else "-" for c in COUNTERS),
            ]
        )
    total = sum(table_rows(args))
    _bench.record(
        args,
        header=f"click model on the open id space (raw 64-bit ids), {args.num_tables} tables of the Criteo "
        f"cardinalities clamped to [{args.min_rows:,}, {args.max_rows:,}] rows ({total:,} rows x "
        f"{1 + args.embedding_dim} floats, 2 shards each; the data's head as many ids), fixed "
        f"(raw ids hashed into the rows) vs dynamic (min_count {args.min_count}) at the same rows, "
        f"SparseAdagrad, global batch {args.batch_size}, {args.steps} steps per job, speed past "
        f"step {args.warmup_steps}, AUC on {args.eval_batches} held-out batches, "
        f"{args.repeats} repetition(s)",
        columns=[
            "variant",
            "examples/s",
            "min..max",
            "x fixed",
            "AUC",
            *(c.replace("_", " ") for c in COUNTERS),
        ],
        rows=rows,
        environment=_bench.environment(),
        baseline=BASELINE,
        results=results,
        figures=figures,
        config={"table_rows": table_rows(args)},
    )


if __name__ == "__main__":
    _bench.main(parse_args, None, run)
