"""Runs every benchmark (each in its own process), prints one table, writes JSON and a chart.

    python -m benchmarks.run_all [--out=bench_out] [--smoke] [--only=NAME,...] [--args="NAME=ARGS"]
    python -m benchmarks.run_all --report_only     # the table, JSON and chart again from --out
    python -m benchmarks.<name> --help             # a benchmark's own flags

Every figure is a ratio against a baseline measured in the same run. After the table come
issue 11's targets, each met / NOT met or why it is missing. Exits 1 if any benchmark failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from benchmarks import _bench
from tfdist_trainer.tables import format_table

BENCHMARKS = (  # in the order they run: one process first, then the clusters
    "trainer_vs_baselines",  # Trainer vs hand-written loop vs Keras 3 fit (one_device)
    "steps_per_loop_auto",  # 'auto' vs fixed steps_per_loop (one_device)
    "mirrored_vs_one_device",  # mirrored on 2 logical CPUs vs one_device
    "mnist_time_to_accuracy",  # MNIST recipe: time to 97% test accuracy, Trainer vs fit
    "model_parallel",  # model_parallel over logical devices vs one_device
    "ps_vs_tf_keras",  # parameter_server Trainer vs tf-keras 2 fit under PSS (separate venv)
    "click_vs_tf_keras",  # the 100m click model under PSS: Trainer vs tf-keras 2 fit (same venv)
    "data_service",  # parameter_server input through the tf.data service vs static shards
    "large_tables",  # the click model's tables: each strategy's steps/s vs one_device
    "dynamic_tables",  # tables that grow vs fixed bucket-hashed tables: examples/s, AUC
    "stacked_lookup",  # many sharded tables under PSS: one lookup per shard vs one per ps
)
TVB = "trainer_vs_baselines"
ISSUE_11_TARGETS = {  # key: (benchmark, what, target)
    "issue11_trainer_vs_handwritten": (
        TVB,
        "one_device Trainer / hand-written loop, time",
        "<= 1.05",
    ),
    "issue11_trainer_vs_fit_default": (TVB, "one_device Trainer vs Keras 3 fit defaults", ">= 1.4"),
    "issue11_isolation": (TVB, "hand-written loop beside the other variants / alone", ">= 0.9"),
    "issue11_ps_vs_tf_keras": (
        "ps_vs_tf_keras",
        "parameter_server Trainer vs tf-keras fit",
        ">= 1.2x",
    ),
}
COLUMNS = [
    "benchmark",
    "figure",
    "value",
    "baseline (same run)",
    "ratio",
    "spread",
    "reps",
    "target",
]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__)
    p.add_argument("--out", default="bench_out")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (for tests; not meaningful)")
    p.add_argument("--only", default=",".join(BENCHMARKS), help=f"a subset of {BENCHMARKS}")
    p.add_argument("--report_only", action="store_true", help="run nothing: report from --out")
    p.add_argument("--args", action="append", default=[], metavar="NAME=ARGS")
    args = p.parse_args(argv)
    args.only = [b for b in args.only.replace(" ", "").split(",") if b]
    unknown = sorted(set(args.only) - set(BENCHMARKS))
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    args.extra = {}
    for item in args.args:
        name, sep, rest = item.partition("=")
        if not sep or name not in BENCHMARKS:
            p.error(
                f"--args needs NAME=ARGS with NAME one of {', '.join(BENCHMARKS)}, got {item!r}"
            )
        args.extra.setdefault(name, []).extend(shlex.split(rest))
    return args


def run_one(name: str, args) -> tuple[int, float]:
    cmd = [sys.executable, "-m", f"benchmarks.{name}", f"--out={args.out}"]
    cmd += ["--smoke"] * args.smoke + args.extra.get(name, [])
    print(f"\n[run_all] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    code = subprocess.call(cmd, env=_bench.child_env(), cwd=_bench.REPO)
    return code, time.perf_counter() - t0


def row(f: dict) -> list[str]:
    v = f["value"]
    value = "-" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    ratio = "-" if f["ratio"] is None else f"{f['ratio']:.3f} {f['ratio_label']}"
    spread = f"{f['spread'][0]:.3f}..{f['spread'][1]:.3f}" if f["spread"] else "-"
    target = (f["target"] or "-") + {True: " met", False: " NOT met", None: ""}[f["meets_target"]]
    cells = [f["benchmark"], f["figure"], f"{value} {f['unit']}", f["baseline"], ratio, spread]
    return [*cells, str(f["repetitions"]), target]


def issue_11(figures: list[dict], status: dict) -> list[dict]:
    by_key = {f.get("key"): f for f in figures if f.get("key")}
    rows = []
    for key, (benchmark, what, target) in ISSUE_11_TARGETS.items():
        f = by_key.get(key) or {}
        if f.get("ratio") is not None:
            result = "met" if f["meets_target"] else "NOT met"
        elif benchmark not in status:
            result = f"not run (add {benchmark} to --only)"
        else:
            result = f"missing: {benchmark} failed or reported no such figure"
        row = {"key": key, "benchmark": benchmark, "what": what, "ratio": f.get("ratio")}
        rows.append({**row, "target": target, "result": result})
    return rows


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    status, figures, devices = {}, [], {}
    for name in args.only:
        code, seconds = (0, 0.0) if args.report_only else run_one(name, args)
        status[name] = {"exit_code": code, "wall_s": round(seconds, 1)}
        path = os.path.join(args.out, f"{name}.json")
        if code == 0 and not os.path.exists(path):
            code = status[name]["exit_code"] = 1
            print(
                f"[run_all] {name} FAILED: it wrote no {path}; run it first (without --report_only)"
            )
        elif code != 0:
            print(f"[run_all] {name} FAILED with exit code {code}", flush=True)
        if code != 0:
            continue
        with open(path) as f:
            payload = json.load(f)
        status[name]["smoke"] = payload.get("smoke", False)
        devices[name] = payload["environment"]["device"]["summary"]
        figures += [{"benchmark": name, **fig} for fig in payload["figures"]]

    smoke = args.smoke or any(st.get("smoke") for st in status.values())
    title = "tfdist_trainer benchmarks" + (" (SMOKE: tiny sizes, not meaningful)" if smoke else "")
    rows = [row(f) for f in figures]
    print(f"\n== {title} ==\n" + format_table(COLUMNS, rows, left=(0, 1, 3, 7)))
    for name, st in status.items():
        outcome = "ok" if st["exit_code"] == 0 else f"FAILED exit {st['exit_code']}"
        print(
            f"  {name}: {outcome}"
            + (" (from its JSON)" if args.report_only else f" in {st['wall_s']:.0f}s")
        )
    targets = issue_11(figures, status)
    table = [
        [t["what"], "-" if t["ratio"] is None else f"{t['ratio']:.3f}", t["target"], t["result"]]
        for t in targets
    ]
    print("\n== issue 11 targets (ratios against baselines measured in the same run) ==")
    print(format_table(["issue 11 target", "ratio", "target", "result"], table, left=(0, 2, 3)))
    for summary in sorted(set(devices.values())):
        print(f"  device: {summary} ({', '.join(n for n, d in devices.items() if d == summary)})")
    try:
        from benchmarks import chart

        png = chart.write_chart(figures, os.path.join(args.out, "run_all.png"), title)
    except ImportError:  # matplotlib is in the charts extra (make bench installs it)
        png = None
        print("[run_all] no chart: matplotlib is not installed (pip install -e '.[charts]')")
    payload = {
        "smoke": smoke,
        "status": status,
        "environment": _bench.environment(),
        "devices": devices,
    }
    payload.update(columns=COLUMNS, rows=rows, figures=figures, issue_11=targets, chart=png)
    path = _bench.write_json(args.out, "run_all", payload)
    print(f"[run_all] wrote {path}" + (f" and {png}" if png else ""), flush=True)
    return 0 if all(st["exit_code"] == 0 for st in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
