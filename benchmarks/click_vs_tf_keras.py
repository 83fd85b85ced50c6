"""The click model at the 100m size under parameter_server: the Trainer vs tf-keras 2 `model.fit`.

What recommender teams on TensorFlow run today: Keras `Embedding` tables that TF's
`variable_partitioner` shards over the ps (``MinSizePartitioner``, at most one shard per ps), under
tf-keras 2 `model.fit` (Keras 3 has no ParameterServerStrategy). Against it, the sharded-embedding
recipe (configs/sharded_embedding/100m.gin: 26 tables, 5.88 M rows of 1 + 16 floats, SparseAdagrad)
as `tfdist-train` runs it. Same model, same data (a pool of the recipe's synthetic batches the
parent writes once), same global batch, same cluster (chief + --num_workers workers + --num_ps ps on
127.0.0.1, a fresh one per run), each variant in its own chief process, interleaved:

  trainer               what `tfdist-train` runs (build_run), parameter_server.steps_per_loop=K
  tf_keras_fit_spe      tf-keras fit, steps_per_execution=K (benchmarks/tf_keras_click_chief.py)
  tf_keras_fit_default  tf-keras fit, its defaults (steps_per_execution=1)

Reported: examples/s (issue 39's target: the Trainer >= 1.5x fit), the bytes the ps connections
carried per step, each way (benchmarks/socket_bytes.py), and the CPU milliseconds per step of the
chief, the workers and the ps (benchmarks/process_cpu.py), over the timed steps. The tf-keras venv is
ps_vs_tf_keras's (--tf_keras_venv, made on first use).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks import _bench
from benchmarks.ps_vs_tf_keras import chief_or_run, open_venv, run_chief, tf_keras_requirement

NAME = "click_vs_tf_keras"
VARIANTS = ("trainer", "tf_keras_fit_spe", "tf_keras_fit_default")
CHIEF_SCRIPT = os.path.join(_bench.REPO, "benchmarks", "tf_keras_click_chief.py")
RECIPE = os.path.join(_bench.REPO, "configs", "sharded_embedding", "100m.gin")
GIN = [RECIPE, f"{_bench.REPO}/configs/strategies/parameter_server.gin"]  # the serving tasks
TARGET = ">= 1.5x"
#: The cluster's roles whose CPU time per step is reported (workers and ps summed over tasks).
ROLES = ("chief", "worker", "ps")
#: ClickTrainer's settings both chiefs build the model from (the tf-keras one layer for layer).
MODEL_SETTINGS = ("vocab_sizes", "embedding_dim", "hidden_units", "num_dense", "learning_rate")


def parse_args(argv):
    p = _bench.parser(
        NAME,
        __doc__,
        steps=200,
        repeats=2,
        warmup_steps=100,
        steps_per_call=50,
        batch_size=1024,
        pool_batches=32,
        steps_per_loop=10,
        max_rows=10**9,
    )
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--num_ps", type=int, default=2)
    p.add_argument("--min_shard_bytes", type=int, default=256 << 10, help="MinSizePartitioner's")
    p.add_argument("--tf_keras_venv", default=os.path.join(_bench.REPO, ".venv-tfkeras"))
    p.add_argument("--timeout_s", type=float, default=1800.0, help="limit per chief")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {VARIANTS}")
    p.add_argument("--chief", help=argparse.SUPPRESS)  # run the Trainer chief of this spec
    smoke = "--steps=20 --steps_per_call=10 --warmup_steps=10 --repeats=1 --batch_size=64 "
    smoke += "--pool_batches=4 --max_rows=3000 --steps_per_loop=5 --min_shard_bytes=16384"
    args = _bench.parse(p, argv, smoke)
    args.variants = [v for v in args.variants.replace(" ", "").split(",") if v]
    chosen = set(args.variants)
    if not chosen <= set(VARIANTS) or "trainer" not in chosen or len(chosen) < 2:
        p.error(f"--variants: trainer and one or both of {', '.join(VARIANTS[1:])}, got {chosen}")
    if args.steps % args.steps_per_call or args.warmup_steps % args.steps_per_call:
        p.error("--steps_per_call must divide --steps and --warmup_steps (fit runs whole epochs)")
    return args


def recipe(args) -> dict:
    """The 100m recipe's model settings (its gin file), the tables capped at --max_rows rows."""
    import gin

    import recipes.sharded_embedding.trainer  # noqa: F401 - registers ClickTrainer

    gin.parse_config_files_and_bindings([RECIPE], [], skip_unknown=True)
    model = {key: gin.query_parameter(f"ClickTrainer.{key}") for key in MODEL_SETTINGS}
    model["vocab_sizes"] = [min(v, args.max_rows) for v in model["vocab_sizes"]]
    model["hidden_units"] = list(model["hidden_units"])
    model["synthetic_seed"] = gin.query_parameter("ClickTrainer.synthetic_seed")
    return model


def write_pool(args, model: dict, path: str) -> None:
    """--pool_batches of the recipe's synthetic batches, as arrays both chiefs read."""
    import numpy as np
    import tensorflow as tf

    from recipes.sharded_embedding.data import SyntheticClicks

    clicks = SyntheticClicks(
        model["vocab_sizes"], num_dense=model["num_dense"], seed=model["synthetic_seed"]
    )
    batches = [clicks.batch(tf.constant(i), args.batch_size) for i in range(args.pool_batches)]
    np.savez(
        path,
        dense=np.concatenate([f["dense"].numpy() for f, _ in batches]),
        categorical=np.concatenate([f["categorical"].numpy() for f, _ in batches]),
        labels=np.concatenate([y.numpy() for _, y in batches]).astype(np.float32),
    )


def trainer_chief(spec: dict) -> dict:
    """The library's side, in a chief process: build_run, warm-up calls, timed calls."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.process_cpu import cluster_cpu, per_step_ms
    from benchmarks.socket_bytes import per_step, ps_traffic
    from recipes.sharded_embedding.trainer import ClickTrainer
    from tfdist_trainer.plan import cluster, network
    from tfdist_trainer.plan.strategies import ParameterServer

    with np.load(spec["data"]) as data:
        pool = ({"dense": data["dense"], "categorical": data["categorical"]}, data["labels"])

    class PoolClickTrainer(ClickTrainer):
        def build_train_dataset(self, input_context):
            batch = self.per_replica_batch_size(input_context)
            # Batched once, then the batches repeat: batching 1024 pool rows one by one at every
            # step cost each side's workers about 4 ms of CPU a step (the in-process profile).
            return (
                tf.data.Dataset.from_tensor_slices(pool)
                .batch(batch, drop_remainder=True)
                .cache()
                .repeat()
                .prefetch(tf.data.AUTOTUNE)
            )

        def build_eval_dataset(self, input_context):
            return None

    trainer_cls = _bench.bound(
        PoolClickTrainer,
        **{key: spec[key] for key in MODEL_SETTINGS},
        global_batch_size=spec["batch_size"],
    )
    strategy = ParameterServer(steps_per_loop=spec["steps_per_loop"])
    network.wait_for_tasks(strategy.peers(cluster.resolve(os.environ)), timeout_s=180)
    t0 = time.perf_counter()
    run = _bench.library_run(trainer_cls, strategy, seed=spec["seed"])
    t_warm, call = time.perf_counter(), spec["steps_per_call"]
    warm = [run.train(call) for _ in range(spec["warmup_steps"] // call)]
    cpu_before, before = cluster_cpu(spec["cluster"]), ps_traffic(spec["cluster"]["ps"])
    t_timed = time.perf_counter()
    timed = [run.train(call) for _ in range(spec["steps"] // call)]
    timed_s, after = time.perf_counter() - t_timed, ps_traffic(spec["cluster"]["ps"])
    cpu_after = cluster_cpu(spec["cluster"])
    return {
        "timed_s": timed_s,
        "build_s": t_warm - t0,
        "warmup_s": t_timed - t_warm,
        "warmup_loss": warm[-1].loss,
        "final_loss": timed[-1].loss,
        "bytes_per_step": per_step(before, after, spec["steps"]),
        "cpu_ms_per_step": per_step_ms(cpu_before, cpu_after, spec["steps"]),
        "steps_per_loop": run.loop.steps_per_loop,
        "steps_counted": int(run.context.global_step.numpy()),
        "expected_steps": len(warm + timed) * call,
        "variable_devices": sorted({v.value.device for v in run.context.trainer.model.variables}),
    }


def run_one(args, variant: str, run_dir: str, spec: dict, tf_keras_python: str) -> dict:
    """A fresh cluster and one chief process for `variant`; the chief's RESULT."""
    spec = {**spec, "steps_per_execution": 1}
    if variant == "tf_keras_fit_spe":
        spec["steps_per_execution"] = args.steps_per_loop
    chief = CHIEF_SCRIPT if variant != "trainer" else None
    result = run_chief(args, NAME, run_dir, GIN, spec, chief, tf_keras_python)
    return {**result, "examples_per_s": args.steps * args.batch_size / result["timed_s"]}


def run(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tf_keras_python = open_venv(NAME, args.tf_keras_venv)
    model = recipe(args)
    data_path = os.path.join(out, f"{NAME}_data.npz")
    write_pool(args, model, data_path)
    spec = {**vars(args), **model, "data": data_path}
    chosen = args.variants
    runs: dict[str, list[dict]] = {v: [] for v in chosen}
    for rep in range(args.repeats):
        for variant in chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]:
            run_dir = os.path.join(out, f"{NAME}_runs", f"r{rep}_{variant}")
            r = run_one(args, variant, run_dir, spec, tf_keras_python)
            runs[variant].append(r)
            sent = r["bytes_per_step"]
            print(
                f"[{NAME}] round {rep + 1}/{args.repeats} {variant}: {r['examples_per_s']:,.0f} "
                f"examples/s, {sent['to_ps'] / 1024:,.0f} KiB to the ps and "
                f"{sent['from_ps'] / 1024:,.0f} KiB back per step",
                flush=True,
            )
    report(args, model, runs)


def report(args, model: dict, runs: dict[str, list[dict]]) -> None:
    import statistics

    results = {}
    for variant, rs in runs.items():
        results[variant] = {
            **_bench.summarize([r["timed_s"] for r in rs], args.steps),
            "examples_per_s": statistics.median(r["examples_per_s"] for r in rs),
            "to_ps_bytes_per_step": statistics.median(r["bytes_per_step"]["to_ps"] for r in rs),
            "from_ps_bytes_per_step": statistics.median(r["bytes_per_step"]["from_ps"] for r in rs),
            "cpu_ms_per_step": {
                role: statistics.median(r["cpu_ms_per_step"][role] for r in rs) for role in ROLES
            },
            "steps_counted_exact": all(r["steps_counted"] == r["expected_steps"] for r in rs),
            "runs": rs,
        }
    figures = []
    for base, label, target in (
        ("tf_keras_fit_spe", f"fit (steps_per_execution={args.steps_per_loop})", TARGET),
        ("tf_keras_fit_default", "fit defaults", None),
    ):
        if base not in results:
            continue
        paired = _bench.ratio_spread(results[base]["times_s"], results["trainer"]["times_s"])
        figures.append(
            _bench.figure(
                f"click model (100m) under parameter_server: Trainer vs tf-keras {label}",
                results["trainer"]["examples_per_s"],
                "examples/s",
                f"tf-keras model.fit, Embedding + variable_partitioner ({base})",
                results[base]["time_s_median"] / results["trainer"]["time_s_median"],
                "speedup",
                args.repeats,
                paired,
                target,
                "issue39_click_vs_tf_keras" if target else None,
            )
        )
    env = _bench.environment()
    env.update(tensorflow=tf_keras_requirement()[0])
    env["tf_keras"] = next(rs[0]["tf_keras"] for v, rs in runs.items() if v != "trainer")
    rows = [
        [
            v,
            f"{r['examples_per_s']:,.0f}",
            f"{r['to_ps_bytes_per_step'] / 1024:,.1f}",
            f"{r['from_ps_bytes_per_step'] / 1024:,.1f}",
            *(f"{r['cpu_ms_per_step'][role]:,.1f}" for role in ROLES),
        ]
        for v, r in results.items()
    ]
    rows_total = sum(model["vocab_sizes"])
    _bench.record(
        args,
        header=f"click model: 26 tables, {rows_total:,} rows x {1 + model['embedding_dim']} floats, "
        f"Adagrad; parameter_server: chief + {args.num_workers} workers + {args.num_ps} ps on "
        f"127.0.0.1 (a fresh cluster per run); global batch {args.batch_size}, {args.steps} timed "
        f"steps x {args.repeats}, {args.steps_per_call} steps per call/epoch",
        columns=[
            "variant",
            "examples/s",
            "KiB to ps / step",
            "KiB from ps / step",
            *(f"{role} CPU ms / step" for role in ROLES),
        ],
        rows=rows,
        environment=env,
        baseline=next(v for v in runs if v != "trainer"),
        results=results,
        model=model,
        cluster={"layout": {"chief": 1, "worker": args.num_workers, "ps": args.num_ps}},
        figures=figures,
    )


def main():
    chief_or_run(parse_args(sys.argv[1:]), trainer_chief, run)


if __name__ == "__main__":
    main()
