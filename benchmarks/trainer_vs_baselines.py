"""The Trainer's steps against a hand-written tf.function loop and Keras 3 `model.fit`, one_device.

Same model, optimizer, loss, metric and data (the MNIST recipe's; an in-memory pool, no shuffle)
for every variant, each in its own process, timed interleaved after an untimed warm-up:

  trainer       what `tfdist-train` runs (build_run), steps_per_loop=--steps_per_loop
  handwritten   the baseline: a plain tf.function of --steps_per_loop steps per call, no strategy
  fit_default   model.fit(steps_per_epoch=steps), Keras defaults (steps_per_execution=1)
  fit_spe100    the same with compile(steps_per_execution=--steps_per_loop)
  (--variants)  trainer_jit (jit_compile=True), fit_default_nojit, fit_spe100_nojit

The isolation check times the hand-written loop once more in a process where every other variant
is built and warmed up too: its speed over the lone loop's must stay >= 0.9.
"""

from __future__ import annotations

from benchmarks import _bench

NAME = "trainer_vs_baselines"
BASELINE = "handwritten"
DEFAULT = ("trainer", "handwritten", "fit_default", "fit_spe100")
VARIANTS = DEFAULT + ("trainer_jit", "fit_default_nojit", "fit_spe100_nojit")
FITS = ("fit_default", "fit_spe100", "fit_default_nojit", "fit_spe100_nojit")
ISOLATION = "handwritten_with_others"
TARGETS = {"fit_default": ">= 1.4", "fit_spe100": ">= 1.0"}
DESCRIPTIONS = {
    "trainer": "tfdist_trainer (build_run), steps_per_loop={spl}",
    "trainer_jit": "tfdist_trainer (build_run), steps_per_loop={spl}, jit_compile=True",
    "handwritten": "tf.function loop, {spl} steps/call",
    "fit_default": "Keras 3 model.fit, defaults",
    "fit_spe100": "Keras 3 model.fit, steps_per_execution={spl}",
    "fit_default_nojit": "Keras model.fit, jit_compile=False",
    "fit_spe100_nojit": "model.fit, steps_per_execution={spl}, jit_compile=False",
}


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, model=True, steps=500, repeats=9, warmup_steps=200)
    p.add_argument("--steps_per_loop", type=int, default=100)
    p.add_argument("--variants", default=",".join(DEFAULT), help=f"a subset of {VARIANTS}")
    p.add_argument("--no_isolation_check", action="store_true")
    smoke = "--steps=20 --repeats=1 --warmup_steps=10 --steps_per_loop=10 --filters=4,8 "
    args = _bench.parse(p, argv, smoke + "--dense_units=16 --batch_size=16")
    args.variants = [v for v in args.variants.split(",") if v]
    if not set(args.variants) <= set(VARIANTS) or BASELINE not in args.variants:
        p.error(f"--variants: pick from {', '.join(VARIANTS)}, with {BASELINE}")
    return args


def compiled(args, template):
    """The template Trainer's model and optimizer, as a Keras user builds them by hand."""
    import keras

    keras.utils.set_random_seed(args.seed)
    trainer = template()
    return trainer.build_model(), trainer.build_optimizer()


def handwritten(args, pool, template):
    import keras
    import tensorflow as tf

    model, optimizer = compiled(args, template)
    optimizer.build(model.trainable_variables)
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    iterator = iter(_bench.make_dataset(pool, args.batch_size).prefetch(tf.data.AUTOTUNE))

    @tf.function
    def train_steps(iterator, n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            images, labels = next(iterator)
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            accuracy.update_state(labels, logits)
        return loss

    def run(steps: int) -> float:
        loss, done = None, 0
        while done < steps:
            n = min(args.steps_per_loop, steps - done)
            loss, done = train_steps(iterator, tf.constant(n, tf.int64)), done + n
        return float(loss)

    return run


def fit(args, pool, template, steps_per_execution: int, jit_compile):
    import keras
    import tensorflow as tf

    model, optimizer = compiled(args, template)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )
    dataset = _bench.make_dataset(pool, args.batch_size).prefetch(tf.data.AUTOTUNE)

    def run(steps: int) -> float:
        history = model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
        run.info = dict(
            jit_compile=bool(model.jit_compile), steps_per_execution=steps_per_execution
        )
        return float(history.history["loss"][-1])

    return run


def build(name: str, args, pool):
    from tfdist_trainer.plan.strategies import OneDevice

    template = _bench.mnist_trainer(args, pool)
    if name.startswith("trainer"):
        jit = name == "trainer_jit"
        run = _bench.library_run(
            template,
            OneDevice(),
            steps_per_loop=args.steps_per_loop,
            seed=args.seed,
            jit_compile=jit,
        )
        return _bench.steps_runner(run)
    if name == BASELINE:
        return handwritten(args, pool, template)
    spe = args.steps_per_loop if "spe100" in name else 1
    return fit(args, pool, template, spe, False if "nojit" in name else "auto")


def serve(args):
    pool, name = _bench.load_pool(args), args.variant_process

    def built():
        if name != ISOLATION:
            return build(name, args, pool)
        others = [build(other, args, pool) for other in args.variants if other != BASELINE]
        for other in others:  # every other variant lives on, warmed up, beside the baseline
            other(args.warmup_steps)
        baseline = build(BASELINE, args, pool)
        baseline.others = others
        return baseline

    description = DESCRIPTIONS.get(name, DESCRIPTIONS[BASELINE] + ", the others built beside it")
    info = {"description": description.format(spl=args.steps_per_loop), "examples": len(pool[1])}
    _bench.serve_variant(built, args.warmup_steps, info)


def run(args):
    names = args.variants + ([] if args.no_isolation_check else [ISOLATION])
    with _bench.Variants(args, names) as v:
        times = v.time(args.steps, args.repeats)
    results = {n: v.result(n, final_loss=v.last[n]) for n in args.variants}
    _bench.add_ratios(results, times, BASELINE, "time_ratio")
    figures, summary, reps = [], {}, args.repeats
    if "trainer" in results:
        r = results["trainer"]
        summary["trainer_over_handwritten_time"] = ratio = r["time_ratio_vs_baseline"]
        figures.append(
            _bench.figure(
                "Trainer one_device, overhead vs a hand-written tf.function loop",
                r["steps_per_s"],
                "steps/s",
                "hand-written tf.function loop",
                ratio,
                "time ratio",
                reps,
                r["time_ratio_vs_baseline_paired"],
                "<= 1.05",
                "issue11_trainer_vs_handwritten",
            )
        )
        for name in (f for f in FITS if f in results):
            paired = _bench.ratio_spread(times[name], times["trainer"])
            ratio = results[name]["time_s_median"] / r["time_s_median"]
            summary[f"trainer_speedup_vs_{name}"] = ratio
            key = "issue11_trainer_vs_fit_default" if name == "fit_default" else None
            description = results[name]["description"]
            figures.append(
                _bench.figure(
                    f"Trainer one_device vs {description}",
                    r["steps_per_s"],
                    "steps/s",
                    description,
                    ratio,
                    "speedup",
                    reps,
                    paired,
                    TARGETS.get(name),
                    key,
                )
            )
    isolation = None
    if ISOLATION in times:
        paired = _bench.ratio_spread(times[BASELINE], times[ISOLATION])
        isolation = v.result(ISOLATION, steps_per_s_ratio_vs_alone=paired["median"])
        figures.append(
            _bench.figure(
                "Isolation check: hand-written loop with the other variants built in its process",
                isolation["steps_per_s"],
                "steps/s",
                "hand-written loop alone in its process",
                paired["median"],
                "steps/s ratio",
                reps,
                paired,
                ">= 0.9",
                "issue11_isolation",
            )
        )
        isolation["meets_target"] = figures[-1]["meets_target"]
    rows = [
        [name, *_bench.rate_cells(r), f"{r['time_ratio_vs_baseline']:.3f}", r["description"]]
        for name, r in results.items()
    ]
    _bench.record(
        args,
        header=f"one_device, a process per variant, {args.steps} steps x {args.repeats}, "
        f"batch {args.batch_size}, data {args.data} ({results[BASELINE]['examples']} examples)",
        columns=["variant", *_bench.RATE_COLUMNS, f"time / {BASELINE}", "what"],
        rows=rows,
        left=(0, 4),
        config={"strategy": "one_device"},
        environment=v.environment(),
        baseline=BASELINE,
        results=results,
        summary=summary,
        isolation=isolation,
        figures=figures,
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
