"""parameter_server Trainer vs tf-keras 2 `model.fit` under ParameterServerStrategy, same cluster.

Keras 3 has no ParameterServerStrategy: parameter_server users run tf-keras 2 today. tf-keras is
not a project dependency: it lives in a benchmark-only venv (--tf_keras_venv, made on first use:
a venv whose .pth shares this project's site-packages, TensorFlow included, plus the tf-keras
wheel matching TensorFlow). Each variant is a chief driving chief + --num_workers workers +
--num_ps ps on 127.0.0.1, the ps and worker tasks serving as `tfdist-train` serves them:

  trainer               what `tfdist-train` runs (build_run), parameter_server.steps_per_loop=K
                        (--steps_per_loop), timed over run.train(--steps_per_call) calls
  tf_keras_fit_spe      tf-keras fit, steps_per_execution=K (benchmarks/tf_keras_ps_chief.py)
  tf_keras_fit_default  tf-keras fit, its defaults (steps_per_execution=1)

Same model, optimizer, data and steps; fit's steps_per_epoch = --steps_per_call, so both join the
coordinator equally often. Every (variant, repetition) gets a fresh cluster, rotating the order.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from benchmarks import _bench

NAME = "ps_vs_tf_keras"
VARIANTS = ("trainer", "tf_keras_fit_spe", "tf_keras_fit_default")
CHIEF_SCRIPT = os.path.join(_bench.REPO, "benchmarks", "tf_keras_ps_chief.py")
STAMP = "tfdist-benchmark-stamp.json"
GIN = [f"{_bench.REPO}/configs/{g}.gin" for g in ("mnist", "strategies/parameter_server")]


class TfKerasVenvError(RuntimeError):
    """The tf-keras venv could not be made; the message is one line."""


def tf_keras_requirement() -> tuple[str, str]:
    """(TensorFlow's version, the matching tf-keras requirement, e.g. 'tf-keras~=2.21.0')."""
    version = importlib.metadata.version("tensorflow")
    return version, "tf-keras~={}.{}.0".format(*version.split(".")[:2])


def _quiet(cmd: list[str], what: str, timeout_s: float = 900) -> str:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TfKerasVenvError(f"{what} failed: {e}") from None
    if proc.returncode != 0:
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines or ["(no output)"]
        raise TfKerasVenvError(f"{what} failed (exit {proc.returncode}): {errors[-1].strip()}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def ensure_tf_keras_venv(path: str) -> str:
    """Makes (once; again when its stamp no longer matches) the tf-keras venv; returns its python."""
    path, (tf_version, requirement) = os.path.abspath(path), tf_keras_requirement()
    python, stamp_path = os.path.join(path, "bin", "python"), os.path.join(path, STAMP)
    shared = sysconfig.get_path("purelib")
    wanted = {"tensorflow": tf_version, "requirement": requirement, "shared_site_packages": shared}
    wanted["python"] = sys.version.split()[0]

    def current() -> bool:
        try:
            with open(stamp_path) as f:
                stamp = json.load(f)
        except (OSError, ValueError):
            return False
        return os.path.exists(python) and all(stamp.get(k) == v for k, v in wanted.items())

    lock_name = f"tfdist-tfkeras-venv-{hashlib.sha1(path.encode()).hexdigest()[:16]}.lock"
    with open(os.path.join(tempfile.gettempdir(), lock_name), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time; the others find it made
        if current():
            return python
        if os.path.exists(path) and os.listdir(path):
            if not os.path.exists(os.path.join(path, "pyvenv.cfg")):
                raise TfKerasVenvError(f"{path} exists and is not a venv; remove it")
            shutil.rmtree(path)
        print(f"[{NAME}] making the tf-keras venv {path} ({requirement})", flush=True)
        _quiet([sys.executable, "-m", "venv", path], f"python -m venv {path}")
        own = _quiet(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], "venv"
        )
        with open(os.path.join(own, "tfdist_shared_project_site_packages.pth"), "w") as f:
            f.write(shared + "\n")
        _quiet(
            [python, "-m", "pip", "install", "--no-input", requirement],
            f"pip install {requirement}",
        )
        check = "import tensorflow as tf, tf_keras; print(tf.__version__, tf_keras.__version__)"
        versions = _quiet([python, "-c", check], "importing tf_keras", 300).split()
        if versions[0] != tf_version or versions[1].split(".")[:2] != tf_version.split(".")[:2]:
            raise TfKerasVenvError(f"{path} has TensorFlow/tf_keras {versions}, not {requirement}")
        with open(stamp_path, "w") as f:
            json.dump({**wanted, "tf_keras": versions[1]}, f)
    return python


def parse_args(argv):
    p = _bench.parser(
        NAME, __doc__, model=True, steps=1000, repeats=3, warmup_steps=200, steps_per_call=100
    )
    p.add_argument("--steps_per_loop", type=int, default=10, help="K: steps per closure")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--num_ps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--tf_keras_venv", default=os.path.join(_bench.REPO, ".venv-tfkeras"))
    p.add_argument("--timeout_s", type=float, default=1800.0, help="limit per chief")
    p.add_argument("--chief", help=argparse.SUPPRESS)  # run the Trainer chief of this spec
    smoke = "--steps=20 --steps_per_call=20 --warmup_steps=20 --repeats=1 --filters=4,8 "
    smoke += "--dense_units=16 --batch_size=16 --data=synthetic --pool_size=1024"
    args = _bench.parse(p, argv, smoke)
    if args.steps % args.steps_per_call or args.warmup_steps % args.steps_per_call:
        p.error("--steps_per_call must divide --steps and --warmup_steps (fit runs whole epochs)")
    return args


def trainer_chief(spec: dict) -> dict:
    """The library's side, in a chief process: build_run, warm-up calls, timed calls."""
    import numpy as np

    from tfdist_trainer.plan import cluster, network
    from tfdist_trainer.plan.strategies import ParameterServer

    args = argparse.Namespace(**spec)
    with np.load(spec["data"]) as data:
        pool = (data["images"], data["labels"])
    strategy = ParameterServer(steps_per_loop=args.steps_per_loop)
    network.wait_for_tasks(strategy.peers(cluster.resolve(os.environ)), timeout_s=180)
    t0 = time.perf_counter()
    trainer_cls = _bench.mnist_trainer(args, pool, learning_rate=args.learning_rate)
    run = _bench.library_run(trainer_cls, strategy, seed=args.seed)
    t_warm, call = time.perf_counter(), args.steps_per_call
    warm = [run.train(call) for _ in range(args.warmup_steps // call)]
    t_timed = time.perf_counter()
    timed = [run.train(call) for _ in range(args.steps // call)]
    size = max(1, min(run.loop.steps_per_loop, -(-call // args.num_workers)))
    return {
        "timed_s": time.perf_counter() - t_timed,
        "build_s": t_warm - t0,
        "warmup_s": t_timed - t_warm,
        "warmup_loss": warm[-1].loss,
        "final_loss": timed[-1].loss,
        "steps_per_loop": run.loop.steps_per_loop,
        "closures_per_call": -(-call // size),
        "steps_counted": int(run.context.global_step.numpy()),
        "expected_steps": len(warm + timed) * call,
        "variable_devices": sorted({v.value.device for v in run.context.trainer.model.variables}),
    }


def run_one(args, variant: str, run_dir: str, data_path: str, tf_keras_python: str | None) -> dict:
    """A fresh cluster and one chief process for `variant`; the chief's RESULT."""
    spec = {**vars(args), "data": data_path}
    spec["steps_per_execution"] = args.steps_per_loop if variant == "tf_keras_fit_spe" else 1
    chief = CHIEF_SCRIPT if variant != "trainer" else None
    result = run_chief(args, NAME, run_dir, GIN, spec, chief, tf_keras_python)
    return {**result, "steps_per_s": args.steps / result["timed_s"]}


def run_chief(
    args, name: str, run_dir: str, gin: list[str], spec: dict, tf_keras_chief: str | None, python
) -> dict:
    """A fresh chief + --num_workers + --num_ps cluster (the ps and workers serving as
    `tfdist-train` serves them, `gin` their files) and one chief: `benchmarks.<name>
    --chief=SPEC` (the Trainer's), or `tf_keras_chief` run by the tf-keras venv's `python`, with
    nothing of this repository on its path. Returns the chief's RESULT and the cluster."""
    layout = {"chief": 1, "worker": args.num_workers, "ps": args.num_ps}
    with _bench.LocalCluster(layout, run_dir, gin) as tasks:
        spec = {**spec, "cluster": tasks.cluster, "startup_timeout_s": 180}
        spec_path = os.path.join(run_dir, "chief_spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = tasks.env("chief", 0)
        cmd = [sys.executable, "-m", f"benchmarks.{name}", f"--chief={spec_path}"]
        if tf_keras_chief:  # only TensorFlow, tf_keras and numpy: not this repository
            cmd = [python, tf_keras_chief, spec_path]
            env.update(PYTHONPATH="", TF_USE_LEGACY_KERAS="1")
        tasks.spawn("chief:0", cmd, env)
        result = tasks.result("chief:0", args.timeout_s)
    return {**result, "cluster": tasks.cluster}


def open_venv(name: str, path: str) -> str:
    """The tf-keras venv's python (made on first use); a failure is one line and exit 1."""
    try:
        return ensure_tf_keras_venv(path)
    except TfKerasVenvError as e:
        print(f"[{name}] error: the tf-keras venv: {e}", file=sys.stderr, flush=True)
        _bench.exit_now(1)


def run(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tf_keras_python = open_venv(NAME, args.tf_keras_venv)
    import numpy as np

    data_path = os.path.join(out, f"{NAME}_data.npz")
    np.savez(data_path, **dict(zip(("images", "labels"), _bench.load_pool(args))))
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for rep in range(args.repeats):
        for variant in VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]:
            run_dir = os.path.join(out, f"{NAME}_runs", f"r{rep}_{variant}")
            r = run_one(args, variant, run_dir, data_path, tf_keras_python)
            runs[variant].append(r)
            print(
                f"[{NAME}] round {rep + 1}/{args.repeats} {variant}: {r['steps_per_s']:.1f} steps/s"
            )
    results = {}
    for variant, rs in runs.items():
        first = rs[0]
        results[variant] = {
            **_bench.summarize([r["timed_s"] for r in rs], args.steps),
            "closures_per_call": first["closures_per_call"],
            "steps_counted_exact": all(r["steps_counted"] == r["expected_steps"] for r in rs),
            "runs": rs,
        }
        key = "steps_per_loop" if variant == "trainer" else "steps_per_execution"
        results[variant][key] = first[key]
    figures = []
    for base, label, target in (
        ("tf_keras_fit_spe", f"fit (steps_per_execution={args.steps_per_loop})", ">= 1.2x"),
        ("tf_keras_fit_default", "fit defaults", None),
    ):
        paired = _bench.ratio_spread(results[base]["times_s"], results["trainer"]["times_s"])
        figures.append(
            _bench.figure(
                f"parameter_server Trainer vs tf-keras {label}",
                results["trainer"]["steps_per_s"],
                "steps/s",
                f"tf-keras model.fit, steps_per_execution={results[base]['steps_per_execution']}",
                results[base]["time_s_median"] / results["trainer"]["time_s_median"],
                "speedup",
                args.repeats,
                paired,
                target,
                "issue11_ps_vs_tf_keras" if target else None,
            )
        )
    env = _bench.environment()
    env.update(tensorflow=tf_keras_requirement()[0], keras=importlib.metadata.version("keras"))
    env["tf_keras"] = runs["tf_keras_fit_spe"][0]["tf_keras"]
    env["tf_keras_importable_in_project_venv"] = importlib.util.find_spec("tf_keras") is not None
    rows = [[v, r["closures_per_call"], *_bench.rate_cells(r)] for v, r in results.items()]
    _bench.record(
        args,
        header=f"parameter_server: chief + {args.num_workers} workers + {args.num_ps} ps on 127.0.0.1 "
        f"(a fresh cluster per run), {args.steps} timed steps x {args.repeats}, "
        f"{args.steps_per_call} steps per call/epoch, batch {args.batch_size}",
        columns=["variant", "closures/call", *_bench.RATE_COLUMNS],
        rows=rows,
        environment=env,
        baseline="tf_keras_fit_spe",
        results=results,
        cluster={"layout": {"chief": 1, "worker": args.num_workers, "ps": args.num_ps}},
        figures=figures,
    )


def main():
    chief_or_run(parse_args(sys.argv[1:]), trainer_chief, run)


def chief_or_run(args, trainer_chief, run) -> None:
    """With --chief=SPEC this process is a Trainer chief (prints its RESULT); else the parent."""
    if args.chief:
        with open(args.chief) as f:
            print("RESULT " + json.dumps(trainer_chief(json.load(f))), flush=True)
        _bench.exit_now(0)
    _bench.main(lambda argv: args, None, run)


if __name__ == "__main__":
    main()
