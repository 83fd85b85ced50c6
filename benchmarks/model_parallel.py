"""model_parallel throughput: pipelined vs unpipelined vs one device, a process per variant.

``--model``: ``lm`` (recipes/model_parallel_lm's byte-level Transformer LM on this repository's
text; defaults --devices=2,4 --num_layers=4 --micro_batches=4 --d_model=128 --batch_size=32) or
``gpt2`` (recipes/keras_hub's GPT2LMTrainer, keras-hub's GPT2CausalLM built from config, random
weights, generated data; defaults --devices=2 --num_layers=4,8 --micro_batches=4,8 --d_model=256
--batch_size=16). d_ff is 4 x --d_model. Per depth L of --num_layers, the variants:

  one_device          the whole model on one device: the reference
  mp{D}               model_parallel plan 'auto' over D devices, num_micro_batches=1
  mp{D}_pipelined     the same with --micro_batches (GPipe; ``_mb{M}`` per M when several)

Names carry the model and depth (gpt2_L4_mp2) except the lm at one depth. Each variant is what
`tfdist-train` runs (build_run; the bytes each device holds, from the placement, in the JSON),
timed around one ``run.train(--steps)`` call. Without GPUs the devices are logical CPUs sharing
the physical cores: the ratio to one_device is then model_parallel's overhead, and what
pipelining wins back is overlap. gpt2's pipelined variants' target: >= 0.9x one_device.
"""

from __future__ import annotations

import os

from benchmarks import _bench

NAME = "model_parallel"
DEFAULTS = {
    "lm": dict(devices="2,4", num_layers="4", micro_batches="4", d_model=128, batch_size=32),
    "gpt2": dict(devices="2", num_layers="4,8", micro_batches="4,8", d_model=256, batch_size=16),
}
LABELS = {"lm": "LM", "gpt2": "GPT-2 (keras-hub)"}


def parse_args(argv):
    p = _bench.parser(NAME, __doc__, steps=10, repeats=3, num_heads=4, seq_len=128, vocab_size=1000)
    p.add_argument("--model", choices=sorted(DEFAULTS), default="lm")
    for flag in ("devices", "num_layers", "micro_batches"):
        p.add_argument(f"--{flag}", help="comma-separated counts")
    p.add_argument("--d_model", type=int)
    p.add_argument("--batch_size", type=int)
    model = p.parse_known_args(argv)[0].model
    defaults = [f"--{k}={v}" for k, v in DEFAULTS[model].items()]  # the flags given come after
    smoke = "--steps=3 --repeats=1 --num_layers=2 --d_model=32 --num_heads=2 --seq_len=16 --batch_size=8"
    args = _bench.parse(p, defaults + list(argv), smoke, lists="devices num_layers micro_batches")
    args.argv = list(argv)
    if min(args.devices) < 2:
        p.error(f"--devices needs counts >= 2, got {args.devices}")
    return args


def variants(args) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for layers in args.num_layers:
        pre = "" if args.model == "lm" and len(args.num_layers) == 1 else f"{args.model}_L{layers}_"
        base = {"num_layers": layers, "baseline": pre + "one_device", "named_depth": bool(pre)}
        out[pre + "one_device"] = {**base, "devices": 1, "micro_batches": 1}
        for d in args.devices:
            out[f"{pre}mp{d}"] = {**base, "devices": d, "micro_batches": 1}
            for m in args.micro_batches:
                mb = f"_mb{m}" if len(args.micro_batches) > 1 else ""
                unpipelined = {"unpipelined": f"{pre}mp{d}"}
                out[f"{pre}mp{d}_pipelined{mb}"] = {
                    **base,
                    "devices": d,
                    "micro_batches": m,
                    **unpipelined,
                }
    return out


def trainer_cls(args, num_layers: int) -> type:
    sizes = dict(
        seq_len=args.seq_len,
        num_layers=num_layers,
        num_heads=args.num_heads,
        global_batch_size=args.batch_size,
        data_seed=args.seed,
    )
    if args.model == "gpt2":
        from recipes.keras_hub.trainer import GPT2LMTrainer

        width = dict(hidden_dim=args.d_model, intermediate_dim=4 * args.d_model)
        return _bench.bound(GPT2LMTrainer, vocabulary_size=args.vocab_size, **width, **sizes)
    from recipes.model_parallel_lm.trainer import TransformerLMTrainer

    data = [os.path.join(_bench.REPO, "*.md"), os.path.join(_bench.REPO, "tfdist_trainer", "*.py")]
    width = dict(d_model=args.d_model, d_ff=4 * args.d_model)
    return _bench.bound(TransformerLMTrainer, data_glob=data, **width, **sizes)


def serve(args):
    from tfdist_trainer.plan.strategies import ModelParallel, OneDevice

    spec = variants(args)[args.variant_process]
    strategy = OneDevice()
    if spec["devices"] > 1:
        strategy = ModelParallel(
            num_devices=spec["devices"],
            num_micro_batches=spec["micro_batches"],
            placement_file=None,
        )

    def build():
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
        trainer = trainer_cls(args, spec["num_layers"])
        run = _bench.library_run(trainer, strategy, steps_per_loop=args.steps, seed=args.seed)
        runner = _bench.steps_runner(run)
        runner.info = dict(spec)
        if spec["devices"] > 1:
            per_device = run.runtime.placement.per_device()
            total = sum(d["bytes"] for d in per_device) or 1
            runner.info["per_device"] = [
                {k: d[k] for k in ("device", "params", "bytes")} | {"share": d["bytes"] / total}
                for d in per_device
            ]
        return runner

    _bench.serve_variant(build, args.steps)  # tracing and the first steps, untimed


def run(args):
    specs = variants(args)
    with _bench.Variants(args, list(specs)) as v:
        times = v.time(args.steps, args.repeats)
    results, figures, notes = {}, [], []
    for name, spec in specs.items():
        r = results[name] = v.result(name, last_loss=v.last[name])
        r["examples_per_s"] = r["steps_per_s"] * args.batch_size
        p = r["speedup_vs_one_device_paired"] = _bench.ratio_spread(
            times[spec["baseline"]], times[name]
        )
        if "unpipelined" in spec:
            q = r["speedup_vs_unpipelined_paired"] = _bench.ratio_spread(
                times[spec["unpipelined"]], times[name]
            )
            notes.append(
                f"{name} vs {spec['unpipelined']} (unpipelined): {q['median']:.2f}x steps/s"
            )
        if spec["devices"] == 1:
            continue
        mb = spec["micro_batches"]
        label = f"model_parallel {LABELS[args.model]}"
        label += f" {spec['num_layers']} blocks" if spec["named_depth"] else ""
        label += f" on {spec['devices']} devices" + (f", {mb} micro-batches" if mb > 1 else "")
        figures.append(
            _bench.figure(
                label + ", steps/s",
                r["steps_per_s"],
                "steps/s",
                f"{spec['baseline']} (the whole model on one device)",
                p["median"],
                "speedup",
                args.repeats,
                p,
                ">= 0.9x" if args.model == "gpt2" and mb > 1 else None,
            )
        )

    def bytes_cell(r):
        if "per_device" not in r:
            return "-"
        mib = "/".join(f"{d['bytes'] / 2**20:.2f}" for d in r["per_device"])
        shares = "/".join(f"{d['share']:.0%}" for d in r["per_device"])
        return f"{mib} MiB ({shares})"

    rows = [
        [n, r["devices"], r["micro_batches"], *_bench.rate_cells(r, ".2f"), bytes_cell(r)]
        for n, r in results.items()
    ]
    _bench.record(
        args,
        header=f"{args.steps} steps x {args.repeats} (median, min..max); ratios paired per round",
        columns=["variant", "devices", "micro_batches", *_bench.RATE_COLUMNS, "bytes per device"],
        rows=rows,
        notes=notes,
        environment=v.environment(),
        baseline=", ".join(dict.fromkeys(s["baseline"] for s in specs.values())),
        results=results,
        figures=figures,
    )


if __name__ == "__main__":
    _bench.main(parse_args, serve, run)
