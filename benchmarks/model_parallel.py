"""model_parallel throughput: pipelined vs unpipelined vs one device, each variant in its own process.

    python -m benchmarks.model_parallel [--model=lm|gpt2] [--devices=2,4] [--num_layers=4]
                                        [--micro_batches=4] [--steps=10] [--repeats=3]
                                        [--d_model=128] [--num_heads=4] [--seq_len=128]
                                        [--batch_size=32] [--vocab_size=1000]
                                        [--out=bench_out] [--smoke]

``--model`` picks the model (the flags it leaves unset take that model's defaults, `DEFAULTS`):

  lm     (the default) recipes/model_parallel_lm's byte-level Transformer LM (TransformerLMTrainer,
         on this repository's own Markdown and Python); defaults --devices=2,4 --num_layers=4
         --micro_batches=4 --d_model=128 --batch_size=32
  gpt2   recipes/keras_hub's GPT2LMTrainer: keras-hub's GPT2CausalLM around a GPT2Backbone built
         from config (random weights, tied LM head, generated data, --vocab_size tokens);
         defaults --devices=2 --num_layers=4,8 --micro_batches=4,8 --d_model=256 (hidden_dim;
         intermediate_dim is 4x) --batch_size=16

Both use Adam, d_ff (intermediate_dim) 4 x --d_model. --devices, --num_layers and --micro_batches
are comma-separated lists. For each depth L of --num_layers, the variants, each with its own
identically seeded model, each in its own process (benchmarks._common.VariantProcesses; the
logical CPUs a variant needs are made there):

  one_device            the model whole on one device (strategies.OneDevice): the reference
  mp{D}                 model_parallel over D devices, plan 'auto', num_micro_batches=1
  mp{D}_pipelined       the same with num_micro_batches=--micro_batches (GPipe schedule);
                        mp{D}_pipelined_mb{M}, one per M, when --micro_batches lists several

The names carry the model and depth (gpt2_L4_one_device, gpt2_L4_mp2_pipelined_mb8) except
for the lm at one depth (one_device, mp2, mp2_pipelined). Each is the library's own path:
state.build_state under the strategy (the model_parallel runtime places the layers; the bytes
each device holds, from the placement, are in the JSON as ``per_device`` and in the report)
and loops.TrainLoop with the runtime's train_step_fn, timed around ``loop.train(steps)`` (one
tf.function call of `--steps` steps). Each variant first runs one untimed call (tracing); the
timed repetitions are interleaved round by round across the processes, rotating the order, so
load drifts hit every variant alike. Ratios are paired per round, each against the one_device
of the same depth.

The figure to report is each variant's steps/s as a ratio to one_device. Without GPUs the
devices are logical CPUs made from the one physical CPU: they share its cores, so model
parallelism cannot add compute here, and the ratio is the overhead of model_parallel 'auto'
(what pipelining can win back is overlap: TF's executor runs ready ops of different stages at
once). For gpt2 the pipelined variants' target is >= 0.9x one_device.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks import _common, _harness

NAME = "model_parallel"
BASELINE = "one_device"
#: Each model's defaults for the flags left unset; the lm's are this benchmark's historical ones.
DEFAULTS = {
    "lm": dict(devices="2,4", num_layers="4", micro_batches="4", d_model=128, batch_size=32),
    "gpt2": dict(devices="2", num_layers="4,8", micro_batches="4,8", d_model=256, batch_size=16),
}
LABELS = {"lm": "LM", "gpt2": "GPT-2 (keras-hub)"}
TARGET = 0.9  # gpt2's pipelined variants vs one_device


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _harness.parser(NAME, __doc__, steps=10, repeats=3)
    p.add_argument("--model", choices=sorted(DEFAULTS), default="lm")
    p.add_argument("--devices", help="comma-separated device counts")
    p.add_argument("--num_layers", help="comma-separated depths (blocks)")
    p.add_argument(
        "--micro_batches", help="comma-separated num_micro_batches of the pipelined variants"
    )
    p.add_argument("--d_model", type=int, help="width (gpt2: hidden_dim)")
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int)
    p.add_argument("--vocab_size", type=int, default=1000, help="gpt2 only (the lm reads bytes)")
    args = _harness.finish(
        p,
        argv,
        smoke="--steps=3 --repeats=1 --num_layers=2 --d_model=32 --num_heads=2 --seq_len=16 --batch_size=8",
        positive="steps repeats",
    )
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _harness.check_positive(p, args, "d_model batch_size vocab_size")
    for key, least in (("devices", 2), ("num_layers", 1), ("micro_batches", 1)):
        values = _common.parse_int_list(getattr(args, key))
        if not values or min(values) < least:
            p.error(f"--{key} needs counts >= {least}, got {getattr(args, key)!r}")
        setattr(args, key, values)
    return args


def _prefix(args, num_layers: int) -> str:
    """'' for the lm at one depth (the historical names), else e.g. 'gpt2_L4_'."""
    return (
        "" if args.model == "lm" and len(args.num_layers) == 1 else f"{args.model}_L{num_layers}_"
    )


def _variants(args) -> dict[str, dict]:
    variants: dict[str, dict] = {}
    for layers in args.num_layers:
        pre = _prefix(args, layers)
        base = {"num_layers": layers, "baseline": pre + BASELINE}
        variants[pre + BASELINE] = {**base, "devices": 1, "micro_batches": 1}
        for d in args.devices:
            variants[f"{pre}mp{d}"] = {**base, "devices": d, "micro_batches": 1}
            for m in args.micro_batches:
                mb = f"_mb{m}" if len(args.micro_batches) > 1 else ""
                variants[f"{pre}mp{d}_pipelined{mb}"] = {
                    **base,
                    "devices": d,
                    "micro_batches": m,
                    "unpipelined": f"{pre}mp{d}",
                }
    return variants


def _trainer(args, num_layers: int):
    """The model --model names, at depth `num_layers`, as a Trainer (built by state.build_state)."""
    sizes = dict(
        seq_len=args.seq_len,
        num_layers=num_layers,
        num_heads=args.num_heads,
        global_batch_size=args.batch_size,
        data_seed=args.seed,
    )
    if args.model == "gpt2":
        from recipes.keras_hub.trainer import GPT2LMTrainer

        return GPT2LMTrainer(
            vocabulary_size=args.vocab_size,
            hidden_dim=args.d_model,
            intermediate_dim=4 * args.d_model,
            **sizes,
        )
    from recipes.model_parallel_lm.trainer import TransformerLMTrainer

    data_glob = [
        os.path.join(_common.REPO, "*.md"),
        os.path.join(_common.REPO, "tfdist_trainer", "*.py"),
    ]
    return TransformerLMTrainer(
        data_glob=data_glob, d_model=args.d_model, d_ff=4 * args.d_model, **sizes
    )


def serve(args: argparse.Namespace) -> None:
    """A child process: one variant, its logical CPUs (or GPUs) made before TensorFlow starts."""
    _common.quiet_tensorflow()
    sys.path.insert(0, _common.REPO)
    from tfdist_trainer.plan.strategies import ModelParallel, OneDevice
    from tfdist_trainer.runtime import strategy_runtime

    spec = _variants(args)[args.variant_process]
    if spec["devices"] == 1:
        config = OneDevice()
    else:
        config = ModelParallel(
            plan="auto",
            num_devices=spec["devices"],
            num_micro_batches=spec["micro_batches"],
            placement_file=None,
        )
        strategy_runtime.prepare_devices(config)

    def build():
        import keras
        import tensorflow as tf

        from tfdist_trainer.runtime import loops
        from tfdist_trainer.runtime import state as state_lib

        tf.get_logger().setLevel("ERROR")
        keras.utils.set_random_seed(args.seed)
        runtime = strategy_runtime.start(config)
        strategy = runtime.strategy
        trainer = _trainer(args, spec["num_layers"])
        global_step, _ = state_lib.build_state(trainer, strategy, runtime=runtime)
        loop = loops.TrainLoop(
            strategy, trainer, global_step, args.steps, step_fn=runtime.train_step_fn(trainer)
        )

        def run(steps: int) -> float:
            return _common.loss_value(loop.train(steps))

        run.info = dict(spec)
        if spec["devices"] > 1:
            per_device = runtime.placement.per_device()
            total = sum(d["bytes"] for d in per_device) or 1
            run.info["per_device"] = [
                {k: d[k] for k in ("device", "params", "bytes")} | {"share": d["bytes"] / total}
                for d in per_device
            ]
        return run

    _common.serve_variant(build, args.steps)  # tracing and the first steps, untimed


def run(args: argparse.Namespace) -> dict:
    variants = _variants(args)
    m = _harness.measure(args, NAME, list(variants))
    results, summary, figures = {}, {}, []
    for name, spec in variants.items():
        r = m.result(name)
        r.pop("warmup_result")
        r["warmup_s"] = r["build_and_warmup_s"]
        r["examples_per_s"] = r["steps_per_s"] * args.batch_size
        p = r["speedup_vs_one_device_paired"] = _common.ratio_spread(
            m.times[spec["baseline"]], m.times[name]
        )
        r["last_loss"] = m.last[name]
        results[name] = r
        if "unpipelined" in spec:
            # > 1: pipelining is faster (time unpipelined / time pipelined, paired per round).
            r["speedup_vs_unpipelined_paired"] = _common.ratio_spread(
                m.times[spec["unpipelined"]], m.times[name]
            )
            key = name.replace(f"mp{spec['devices']}_pipelined", "pipelined")
            summary[f"{key}_speedup_{spec['devices']}_devices"] = r["speedup_vs_unpipelined_paired"]
        if spec["devices"] == 1:
            continue
        mb = spec["micro_batches"]
        target = args.model == "gpt2" and mb > 1
        figures.append(
            _common.figure(
                f"model_parallel {LABELS[args.model]}"
                + (f" {spec['num_layers']} blocks" if _prefix(args, spec["num_layers"]) else "")
                + f" on {spec['devices']} devices"
                + (f", {mb} micro-batches" if mb > 1 else "")
                + ", steps/s",
                r["steps_per_s"],
                "steps/s",
                baseline=f"{spec['baseline']} (the whole model on one device)",
                ratio=p["median"],
                ratio_label="speedup",
                repetitions=args.repeats,
                spread=_harness.spread(p),
                target=f">= {TARGET}x" if target else None,
                meets_target=p["median"] >= TARGET if target else None,
            )
        )
    return _harness.record(
        args,
        format_report,
        config={
            k: v
            for k, v in vars(args).items()
            if k not in ("out", "argv", "variant_process", "benchmark")
        },
        environment=m.environment(),
        baseline=", ".join(dict.fromkeys(s["baseline"] for s in variants.values())),
        results=results,
        summary=summary,
        figures=figures,
    )


def _bytes_cell(r: dict) -> str:
    """Each device's MiB and share of the model's bytes, e.g. '3.10/3.00 MiB (51%/49%)'."""
    if "per_device" not in r:
        return "-"
    mib = "/".join(f"{d['bytes'] / 2**20:.2f}" for d in r["per_device"])
    shares = "/".join(f"{d['share']:.0%}" for d in r["per_device"])
    return f"{mib} MiB ({shares})"


def format_report(payload: dict) -> str:
    rows = [
        [
            name,
            r["devices"],
            r["micro_batches"],
            *_harness.stats_cells(r, ".2f"),
            f"{r['examples_per_s']:.0f}",
            f"{r['speedup_vs_one_device_paired']['median']:.2f}",
            _bytes_cell(r),
        ]
        for name, r in payload["results"].items()
    ]
    notes = [
        f"{name} ({r['micro_batches']} micro-batches) vs {r['unpipelined']} (unpipelined): "
        f"{q['median']:.2f}x steps/s (paired per round, min..max {q['min']:.2f}..{q['max']:.2f})"
        for name, r in payload["results"].items()
        if (q := r.get("speedup_vs_unpipelined_paired"))
    ]
    notes += [
        f"{f['figure']}: {f['ratio']:.2f}x {f['baseline'].split()[0]}, target {f['target']}: "
        + _harness.met(f["meets_target"])
        for f in payload["figures"]
        if f["target"]
    ]
    cfg = payload["config"]
    return _harness.report(
        payload,
        f"{cfg['steps']} steps x {cfg['repeats']} repetitions (median, min..max); "
        f"baseline: {payload['baseline']} (speedup paired per round)",
        [
            "variant",
            "devices",
            "micro_batches",
            *_harness.STATS_COLUMNS,
            "examples/s",
            "vs one_device",
            "bytes per device",
        ],
        rows,
        notes=notes,
    )


def main(argv: list[str] | None = None) -> int:
    return _harness.main(argv, parse_args, serve, run)


if __name__ == "__main__":
    sys.exit(main())
