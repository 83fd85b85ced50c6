"""MNIST recipe: wall time until the test accuracy first reaches a target (97%), one_device.

Data: the recipe's loader; with 'auto' the IDX files in --idx_dir, then a TFDS mnist prepared in
--tfds_data_dir, else the offline digits (1438 train / 359 test; NOT MNIST, and every figure
says so). Nothing is downloaded.

Both variants train the same model, optimizer, batch and data order (the recipe's pipeline, its
shuffle seeded per repetition) and evaluate on the test split every --eval_every steps until
the target (or --max_steps):

  trainer       what `tfdist-train` runs (build_run, steps_per_loop=--eval_every), then the
                task's evaluator after every loop
  fit_default   the baseline: compile with Keras defaults, one model.fit(steps_per_epoch=
                eval_every, validation_data=test) with a callback stopping at the target

Timed from the first training call (tracing included): training time, wall time with the
evaluations, process CPU time, steps to target. Each variant in its own process, warmed up once
(untimed); repetition k uses seed --seed+k for both, the order alternating.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks import _bench

NAME = "mnist_time_to_accuracy"
VARIANTS = ("trainer", "fit_default")
BASELINE = "fit_default"
SPEEDUP_KEYS = {
    "train_s_to_target": "training time",
    "wall_s_to_target": "wall time incl. eval",
    "cpu_s_to_target": "process CPU time incl. eval",
}
DESCRIPTIONS = {
    "trainer": "tfdist_trainer one_device (build_run), steps_per_loop={every}, eval every {every}",
    "fit_default": "Keras model.fit defaults, steps_per_epoch={every} + validation_data",
}


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, repeats=3, eval_every=50, max_steps=2000, batch_size=64)
    p.add_argument("--target_accuracy", type=float, default=0.97)
    p.add_argument("--eval_batch_size", type=int, default=None, help="default: --batch_size")
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--filters", default="32,64")
    p.add_argument("--dense_units", type=int, default=128)
    p.add_argument("--shuffle_buffer", type=int, default=10_000)
    p.add_argument("--data_source", default="auto", choices=("auto", "tfds", "idx", "digits"))
    p.add_argument("--idx_dir", "--data_dir", dest="idx_dir", help="the four MNIST IDX files")
    p.add_argument("--tfds_data_dir", help="a TFDS data directory in which mnist is prepared")
    p.add_argument("--no_warmup", action="store_true", help="no untimed warm-up run")
    smoke = "--target_accuracy=0.5 --eval_every=20 --max_steps=400 --repeats=1 --filters=4,8 "
    smoke += "--dense_units=16 --batch_size=16 --eval_batch_size=128 --no_warmup"
    args = _bench.parse(p, argv, smoke)
    if not 0.0 < args.target_accuracy <= 1.0 or args.learning_rate <= 0:
        p.error("--target_accuracy must be in (0, 1] and --learning_rate > 0")
    if args.max_steps < args.eval_every:
        p.error(f"--max_steps ({args.max_steps}) must be >= --eval_every ({args.eval_every})")
    if (args.data_source == "idx" and not args.idx_dir) or not os.path.isdir(args.idx_dir or "."):
        p.error("--data_source=idx needs --idx_dir, a directory")
    args.max_steps -= args.max_steps % args.eval_every
    args.eval_batch_size = args.eval_batch_size or args.batch_size
    return args


def load_data(args) -> dict[str, Any]:
    """Both splits through the recipe's loader, once; says which data it is."""
    from recipes.mnist import data as mnist_data

    where = dict(source=args.data_source, tfds_data_dir=args.tfds_data_dir, idx_dir=args.idx_dir)
    (train, label), (test, _) = (mnist_data.load_mnist(s, **where) for s in ("train", "test"))
    is_mnist = label != mnist_data.FALLBACK_LABEL
    return {
        "splits": {"train": train, "test": test},
        "label": label,
        "short_name": "MNIST" if is_mnist else "offline digits fallback (NOT MNIST)",
        "is_mnist": is_mnist,
        "train_examples": int(train.cardinality()),
        "test_examples": int(test.cardinality()),
    }


def make_trainer(args, data, seed: int) -> type:
    """The recipe's MnistTrainer on the splits loaded once, its shuffle seeded."""
    import tensorflow as tf

    from recipes.mnist import data as mnist_data
    from recipes.mnist.trainer import MnistTrainer
    from tfdist_trainer import shard

    class SeededMnistTrainer(MnistTrainer):
        def _load(self, split):
            self._source_label = data["label"]
            return data["splits"][split]

        def build_train_dataset(self, input_context):
            return (
                shard(self._load("train"), input_context)
                .map(mnist_data.normalize, num_parallel_calls=tf.data.AUTOTUNE)
                .cache()
                .shuffle(self.shuffle_buffer, seed=seed)
                .repeat()
                .batch(self.per_replica_batch_size(input_context), drop_remainder=True)
            )

    sizes = dict(global_batch_size=args.batch_size, eval_batch_size=args.eval_batch_size)
    sizes.update(filters=args.filters, dense_units=args.dense_units)
    sizes.update(learning_rate=args.learning_rate, shuffle_buffer=args.shuffle_buffer)
    return _bench.bound(SeededMnistTrainer, **sizes)


class Clock:
    """Splits the time into training and evaluation; notes every evaluation and the target's."""

    def __init__(self, target: float):
        self.target, self.t0, self.cpu0 = target, time.perf_counter(), time.process_time()
        self.mark, self.train_s, self.eval_s, self.first_s = self.t0, 0.0, 0.0, None
        self.evals, self.reached_at = [], None

    def trained(self) -> None:
        now = time.perf_counter()
        self.train_s += now - self.mark
        self.first_s = self.first_s if self.first_s is not None else now - self.mark
        self.mark = now

    def evaluated(self, step: int, accuracy: float) -> bool:
        """Records an evaluation; True once it reaches the target."""
        now = time.perf_counter()
        self.eval_s, self.mark = self.eval_s + now - self.mark, now
        cpu_s = time.process_time() - self.cpu0
        wall = {"train_s": self.train_s, "wall_s": now - self.t0, "cpu_s": cpu_s}
        self.evals.append({"step": step, "accuracy": accuracy, **wall})
        if accuracy >= self.target and self.reached_at is None:
            self.reached_at = len(self.evals) - 1
        return self.reached_at is not None

    def outcome(self) -> dict[str, Any]:
        at = self.evals[self.reached_at] if self.reached_at is not None else {}
        return {
            "reached": bool(at),
            "steps_to_target": at.get("step"),
            "accuracy_at_target": at.get("accuracy"),
            **{f"{k}_to_target": at.get(k) for k in ("train_s", "wall_s", "cpu_s")},
            "first_segment_train_s": self.first_s,
            "steps_run": self.evals[-1]["step"] if self.evals else 0,
            "train_s_total": self.train_s,
            "eval_s_total": self.eval_s,
            "best_accuracy": max((e["accuracy"] for e in self.evals), default=None),
            "evals": [[e["step"], round(e["accuracy"], 6)] for e in self.evals],
        }


def run_trainer(args, data, seed: int, max_steps: int, target: float) -> dict[str, Any]:
    from tfdist_trainer.plan.strategies import OneDevice

    t_build = time.perf_counter()
    trainer_cls = make_trainer(args, data, seed)
    run = _bench.library_run(trainer_cls, OneDevice(), steps_per_loop=args.eval_every, seed=seed)
    clock, step = Clock(target), 0
    while step < max_steps:
        run.train(args.eval_every)  # returns host floats: the steps are done
        clock.trained()
        step = int(run.context.global_step.numpy())
        if clock.evaluated(step, run.context.evaluator.evaluate()["accuracy"]):
            break
    return {**clock.outcome(), "setup_s": clock.t0 - t_build}


def run_fit(args, data, seed: int, max_steps: int, target: float) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    from tfdist_trainer.trainers import data as data_lib

    keras.utils.set_random_seed(seed)
    template, context = make_trainer(args, data, seed)(), data_lib.single_pipeline_context()
    t_build = time.perf_counter()
    model = template.build_model()
    model.compile(
        optimizer=template.build_optimizer(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    train = template.build_train_dataset(context).prefetch(tf.data.AUTOTUNE)
    test = template.build_eval_dataset(context).prefetch(tf.data.AUTOTUNE)
    clock = Clock(target)

    class Callback(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):
            self.step = int(self.model.optimizer.iterations.numpy())  # the steps are done
            clock.trained()

        def on_epoch_end(self, epoch, logs=None):
            if clock.evaluated(self.step, float(logs["val_accuracy"])):
                self.model.stop_training = True

    epochs, every = max_steps // args.eval_every, args.eval_every
    model.fit(  # shuffle=False only silences a warning: fit never shuffles a tf.data.Dataset
        train,
        epochs=epochs,
        steps_per_epoch=every,
        validation_data=test,
        callbacks=[Callback()],
        verbose=0,
        shuffle=False,
    )
    spe = int(model.steps_per_execution)
    return {**clock.outcome(), "setup_s": clock.t0 - t_build, "steps_per_execution": spe}


RUNNERS = {"trainer": run_trainer, "fit_default": run_fit}


def _stats(values: list) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize_variant(name: str, runs: list[dict], args) -> dict[str, Any]:
    reached = [r for r in runs if r["reached"]]
    return {
        "description": DESCRIPTIONS[name].format(every=args.eval_every),
        "repetitions": len(runs),
        "reached_in": len(reached),
        "steps_to_target_per_seed": [r["steps_to_target"] for r in runs],
        **{key: _stats([r[key] for r in reached]) for key in SPEEDUP_KEYS},
        "first_segment_train_s": _stats([r["first_segment_train_s"] for r in runs]),
        "eval_s_per_pass": _stats(
            [r["eval_s_total"] / len(r["evals"]) for r in runs if r["evals"]]
        ),
        "best_accuracy_per_seed": [r["best_accuracy"] for r in runs],
        "runs": runs,
    }


def paired_speedups(results: dict, key: str) -> dict[str, Any] | None:
    """fit time / trainer time per repetition in which both reached the target."""
    pairs = [
        (b[key], t[key])
        for b, t in zip(results[BASELINE]["runs"], results["trainer"]["runs"])
        if b["reached"] and t["reached"]
    ]
    if not pairs:
        return None
    return {**_bench.ratio_spread(*zip(*pairs)), "pairs": len(pairs)}


def compare_trajectories(results: dict) -> dict[str, Any]:
    """Whether both variants followed the same accuracy curve, seed by seed."""
    diffs, same = [], []
    for b, t in zip(results[BASELINE]["runs"], results["trainer"]["runs"]):
        fit_acc, trainer_acc = dict(b["evals"]), dict(t["evals"])
        common = set(fit_acc) & set(trainer_acc)
        diffs.append(max((abs(fit_acc[s] - trainer_acc[s]) for s in common), default=None))
        same.append(b["steps_to_target"] == t["steps_to_target"])
    return {"max_abs_accuracy_diff_per_seed": diffs, "same_steps_to_target_per_seed": same}


def make_figures(args, dataset: dict, results: dict, speedups: dict) -> list[dict]:
    n, trainer = args.repeats, results["trainer"]
    reached = trainer["reached_in"] == n == results[BASELINE]["reached_in"]
    figures = []
    for key, what in (("train_s_to_target", "training time"), ("wall_s_to_target", "wall time")):
        s = speedups[key] or {}
        name = (
            f"{dataset['short_name']} {what} to {args.target_accuracy:.0%} test accuracy, Trainer"
        )
        if not reached:
            name += f" - target NOT REACHED within {args.max_steps} steps in some repetitions"
        fig = _bench.figure(
            name,
            trainer[key]["median"] if reached else None,
            "s",
            f"Keras model.fit defaults (same model, data order, eval every {args.eval_every})",
            s.get("median"),
            "speedup (fit time / Trainer time)",
            n,
            s or None,
        )
        figures.append(fig if reached else {**fig, "note": "the target was not reached"})
    return figures


def notes(args, results: dict) -> list[str]:
    """The repetitions that missed the target, honestly."""
    return [
        f"{name}: target {args.target_accuracy} NOT reached within --max_steps={args.max_steps} in "
        f"{r['repetitions'] - r['reached_in']} of {r['repetitions']} repetition(s) "
        f"(best accuracy per seed: {r['best_accuracy_per_seed']})"
        for name, r in results.items()
        if r["reached_in"] < r["repetitions"]
    ]


def serve(args):
    import tensorflow as tf

    # Each repetition builds and traces fresh step functions, on purpose.
    tf.get_logger().addFilter(
        lambda record: "triggered tf.function retracing" not in record.getMessage()
    )
    data, name = load_data(args), args.variant_process
    dataset = {k: v for k, v in data.items() if k != "splits"}

    def build():
        if not args.no_warmup:  # one interval, target unreachable: start-up costs, untimed
            RUNNERS[name](args, data, args.seed, args.eval_every, 2.0)
        return lambda seed: RUNNERS[name](args, data, seed, args.max_steps, args.target_accuracy)

    _bench.serve_variant(build, None, {"dataset": dataset})


def run(args):
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with _bench.Variants(args, VARIANTS) as v:
        dataset = v.info["trainer"]["dataset"]
        if not dataset["is_mnist"]:
            print(f"[{NAME}] NOTE: no MNIST here: timing the offline digits, which are NOT MNIST")
        for rep in range(args.repeats):
            seed = args.seed + rep
            for name in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
                reply = v.request(name, seed)
                runs[name].append({"seed": seed, "process": v.procs[name].pid, **reply["result"]})
            print(f"[{NAME}] repetition {rep + 1}/{args.repeats} (seed {seed}) done", flush=True)
    results = {name: summarize_variant(name, runs[name], args) for name in VARIANTS}
    speedups = {key: paired_speedups(results, key) for key in SPEEDUP_KEYS}

    def cell(stats):
        return (
            "-"
            if stats is None
            else f"{stats['median']:.2f} ({stats['min']:.2f}..{stats['max']:.2f})"
        )

    rows = [
        [
            name,
            f"{r['reached_in']}/{r['repetitions']}",
            ",".join(str(s) for s in r["steps_to_target_per_seed"]),
            *(cell(r[key]) for key in SPEEDUP_KEYS),
            r["description"],
        ]
        for name, r in results.items()
    ]
    _bench.record(
        args,
        header=f"{dataset['label']} ({dataset['train_examples']} train / {dataset['test_examples']} "
        f"test): time to test accuracy >= {args.target_accuracy}, one_device, median (min..max)",
        columns=[
            "variant",
            "reached",
            "steps/seed",
            "train s",
            "wall s incl. eval",
            "CPU s",
            "what",
        ],
        rows=rows,
        left=(0, 2, 6),
        notes=notes(args, results),
        config={
            "seeds": [args.seed + r for r in range(args.repeats)],
            "process_layout": "one process per variant, repetitions alternating in order",
        },
        environment=v.environment(),
        baseline=BASELINE,
        dataset=dataset,
        results=results,
        speedups=speedups,
        trajectories=compare_trajectories(results),
        figures=make_figures(args, dataset, results, speedups),
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
