"""Runs every benchmark (each in its own process) and prints one combined table: `make bench`.

    python -m benchmarks.run_all [--out=bench_out] [--smoke] [--only=trainer_vs_baselines,ps_steps_per_loop]
                                 [--trainer_args="--steps=2000"] [--ps_args="--repeats=5"]

Each benchmark writes ``<out>/<name>.json``; this script adds ``<out>/run_all.json``
(the combined rows) and exits non-zero if any benchmark failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from benchmarks import _common

BENCHMARKS = ("trainer_vs_baselines", "ps_steps_per_loop")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_all", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=_common.DEFAULT_OUT)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (for tests)")
    p.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset of the benchmarks")
    p.add_argument("--trainer_args", default="", help="extra arguments for trainer_vs_baselines")
    p.add_argument("--ps_args", default="", help="extra arguments for ps_steps_per_loop")
    args = p.parse_args(argv)
    args.only = [b for b in args.only.split(",") if b]
    unknown = sorted(set(args.only) - set(BENCHMARKS))
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    return args


def _run_one(name: str, args: argparse.Namespace) -> tuple[int, float]:
    extra = shlex.split(args.trainer_args if name == "trainer_vs_baselines" else args.ps_args)
    cmd = [sys.executable, "-m", f"benchmarks.{name}", f"--out={args.out}", *(["--smoke"] if args.smoke else []),
           *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_common.REPO, env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"[run_all] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    code = subprocess.call(cmd, env=env, cwd=_common.REPO)
    return code, time.perf_counter() - t0


def combined_rows(payloads: dict[str, dict]) -> list[list[str]]:
    rows = []
    tvb = payloads.get("trainer_vs_baselines")
    if tvb:
        base = tvb["baseline"]
        for name, r in tvb["results"].items():
            rows.append(["trainer_vs_baselines", name, f"{r['steps_per_s']:.1f}",
                         f"{r['steps_per_s_min']:.1f}..{r['steps_per_s_max']:.1f}", f"{r['time_s_median']:.3f}",
                         f"{r['time_ratio_vs_baseline']:.3f} (time / {base})"])
    ps = payloads.get("ps_steps_per_loop")
    if ps:
        for r in ps["results"]:
            rows.append(["ps_steps_per_loop", f"steps_per_loop={r['steps_per_loop']}, {r['steps_per_call']} steps/call",
                         f"{r['steps_per_s']:.1f}", f"{r['steps_per_s_min']:.1f}..{r['steps_per_s_max']:.1f}",
                         f"{r['time_s_median']:.3f}", f"{r['speedup_vs_baseline']:.2f}x (vs {ps['baseline']})"])
    return rows


def headlines(payloads: dict[str, dict]) -> list[str]:
    lines = []
    tvb = payloads.get("trainer_vs_baselines")
    if tvb:
        s = tvb["summary"]
        if "trainer_over_handwritten_time" in s:
            lines.append(f"trainer / handwritten time = {s['trainer_over_handwritten_time']:.3f} "
                         f"(target <= {s['trainer_over_handwritten_target_max']}: "
                         f"{'met' if s['trainer_over_handwritten_meets_target'] else 'NOT met'})")
        if "trainer_speedup_vs_fit_default" in s:
            lines.append(f"trainer speedup vs fit default = {s['trainer_speedup_vs_fit_default']:.2f}x "
                         f"(target >= {s['trainer_speedup_vs_fit_default_target_min']}x: "
                         f"{'met' if s['trainer_speedup_vs_fit_default_meets_target'] else 'NOT met'})")
        if "trainer_speedup_vs_fit_spe100" in s:
            lines.append(f"trainer speedup vs fit steps_per_execution=100 = {s['trainer_speedup_vs_fit_spe100']:.2f}x")
    ps = payloads.get("ps_steps_per_loop")
    if ps:
        rec = ps["recommendation"]
        lines.append(f"parameter_server: recommended parameter_server.steps_per_loop = {rec['steps_per_loop']} "
                     f"({rec['rule']})")
        if not ps.get("global_step_exact", True):
            lines.append("parameter_server: WARNING global step differs from the steps run")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    payloads, status = {}, {}
    for name in args.only:
        code, seconds = _run_one(name, args)
        status[name] = {"exit_code": code, "wall_s": seconds}
        path = os.path.join(args.out, f"{name}.json")
        if code == 0 and os.path.exists(path):
            with open(path) as f:
                payloads[name] = json.load(f)
        else:
            print(f"[run_all] {name} failed with exit code {code}", flush=True)

    rows = combined_rows(payloads)
    print("\n== combined benchmark results" + (" (SMOKE: tiny sizes, not meaningful)" if args.smoke else "") + " ==")
    if rows:
        print(_common.format_table(["benchmark", "variant", "steps/s", "steps/s min..max", "time s", "ratio"], rows,
                                  left=(0, 1, 5)))
    for line in headlines(payloads):
        print(line)
    for name, st in status.items():
        print(f"{name}: exit {st['exit_code']} in {st['wall_s']:.0f}s")
    path = _common.write_json(args.out, "run_all", {
        "smoke": args.smoke, "status": status,
        "columns": ["benchmark", "variant", "steps/s", "steps/s min..max", "time s", "ratio"],
        "rows": rows, "headlines": headlines(payloads)})
    print(f"[run_all] wrote {path}", flush=True)
    return 0 if all(st["exit_code"] == 0 for st in status.values()) and len(payloads) == len(args.only) else 1


if __name__ == "__main__":
    sys.exit(main())
