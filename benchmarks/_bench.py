"""The benchmarks' one helper module: flags, data, the library's path, one process per variant,
a local cluster, statistics, figures, the report and the JSON.

TensorFlow is imported lazily, so that a benchmark can set up devices and TF_CONFIG first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from tfdist_trainer.launch.console import ConsoleFilter
from tfdist_trainer.tables import format_table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANT_FLAG = "--variant_process"  # the hidden flag of a variant's child process
_REPLY = "@@variant@@ "
_MODEL_DIRS: list[str] = []
CPU = ("user", "sys")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# -- flags -----------------------------------------------------------------------------------------


def parser(
    name: str, doc: str | None, *, model: bool = False, **ints: int
) -> argparse.ArgumentParser:
    """``python -m benchmarks.<name>``'s flags: `ints` (e.g. steps=500), the model's, the common ones."""
    p = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, default in ints.items():
        p.add_argument(f"--{flag}", type=int, default=default)
    if model:  # the MNIST recipe's CNN and the in-memory pool it reads
        p.add_argument("--batch_size", type=int, default=64, help="global batch")
        p.add_argument("--filters", default="32,64", help="the two Conv2D widths")
        p.add_argument("--dense_units", type=int, default=128)
        p.add_argument("--data", default="digits", choices=("digits", "synthetic"))
        p.add_argument("--pool_size", type=int, default=4096, help="synthetic examples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out", help=f"directory for {name}.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (for tests)")
    p.add_argument(VARIANT_FLAG, help=argparse.SUPPRESS)
    return p


def parse(p: argparse.ArgumentParser, argv: list[str], smoke: str = "", lists: str = ""):
    """Parses `argv` (--smoke appends `smoke`); --filters and the flags named in `lists` become
    lists of positive ints; every integer flag but --seed must be >= 1."""
    args = p.parse_args(argv)
    if args.smoke and smoke:
        args = p.parse_args([*argv, *smoke.split()])
    args.argv, args.benchmark = list(argv), p.prog.rsplit(".", 1)[-1]
    for name in ["filters", *lists.split()]:
        text = getattr(args, name, None)
        if text is None:
            continue
        try:
            values = [int(x) for x in str(text).replace(" ", "").split(",") if x]
        except ValueError:
            values = []
        if not values or min(values) < 1 or (name == "filters" and len(values) != 2):
            p.error(f"--{name} needs positive integers, got {text!r}")
        setattr(args, name, values)
    for key, value in vars(args).items():
        if type(value) is int and key != "seed" and value < 1:
            p.error(f"--{key} must be >= 1, got {value}")
    return args


def main(parse_args, serve, run, argv: list[str] | None = None) -> None:
    """A variant's child process serves its variant; the parent runs the benchmark."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    (serve if getattr(args, "variant_process", None) else run)(args)
    exit_now(0)


def exit_now(code: int) -> None:
    """Leaves at once: coordinator or collective threads can keep a finished process alive."""
    for path in _MODEL_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without TF_CONFIG, the repository on PYTHONPATH, quiet TensorFlow."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return {**env, **extra}


# -- data and the library's path -------------------------------------------------------------------


def load_pool(args) -> tuple[Any, Any]:
    """(images uint8 [N, 28, 28, 1], labels int64 [N]): the recipe's offline digits, or random."""
    import numpy as np

    if args.data == "digits":
        from recipes.mnist.data import _digits_arrays

        images, labels = _digits_arrays("train")
        return images[..., None], labels
    rng = np.random.RandomState(args.seed)
    images = rng.randint(0, 256, size=(args.pool_size, 28, 28, 1), dtype=np.uint8)
    return images, rng.randint(0, 10, size=(args.pool_size,)).astype(np.int64)


def make_dataset(pool, batch_size: int):
    """The pipeline every variant reads: normalize, cache, repeat, batch; no shuffle, no prefetch."""
    import tensorflow as tf

    from recipes.mnist.data import normalize

    return (
        tf.data.Dataset.from_tensor_slices(pool)
        .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .repeat()
        .batch(batch_size, drop_remainder=True)
    )


def bound(cls: type, **kwargs) -> type:
    """`cls` with its constructor's arguments bound: `Experiment` calls ``trainer_cls()``."""
    return type(cls.__name__, (cls,), {"__init__": lambda self: cls.__init__(self, **kwargs)})


def mnist_trainer(args, pool, **kwargs) -> type:
    """The MNIST recipe's Trainer (model, loss, optimizer, metrics) reading `pool`, sized by flags."""
    from recipes.mnist.trainer import MnistTrainer

    class BenchMnistTrainer(MnistTrainer):
        def build_train_dataset(self, input_context):
            return make_dataset(pool, self.per_replica_batch_size(input_context))

    sizes = dict(
        global_batch_size=args.batch_size, filters=args.filters, dense_units=args.dense_units
    )
    return bound(BenchMnistTrainer, data_source="digits", **sizes, **kwargs)


def library_run(trainer_cls: type, strategy, **experiment):
    """The training task `tfdist-train` builds (`build_run`): strategy, state, restore, loop.

    `experiment` is `Experiment`'s (steps_per_loop, seed, jit_compile...); the cluster is
    TF_CONFIG's, or this process alone; the model_dir a fresh temporary one.
    """
    from tfdist_trainer.plan.cluster import resolve
    from tfdist_trainer.plan.experiment import Experiment
    from tfdist_trainer.runtime.train.setup import build_run

    _MODEL_DIRS.append(tempfile.mkdtemp(prefix="bench-model-dir-"))
    settings = dict(train_steps=10**9, checkpoint_every_n_steps=None, **experiment)
    exp = Experiment(trainer_cls=trainer_cls, strategy=strategy, **settings)
    return build_run(exp, resolve(os.environ), _MODEL_DIRS[-1])


def steps_runner(run):
    """n -> the mean loss of ``run.train(n)`` (blocking), as `tfdist-train` runs its steps."""

    def train(steps: int) -> float:
        return float(run.train(steps).loss)

    train.run = run
    return train


# -- one process per variant -----------------------------------------------------------------------


def _say(message: dict) -> None:
    print(_REPLY + json.dumps(message), flush=True)


def serve_variant(build, warmup: Any = None, info: dict | None = None) -> None:
    """A child's side: builds its variant, warms it up, then runs each request on stdin (a JSON
    line: steps, or a seed) and answers with its seconds, user and system CPU and result."""
    t0 = time.perf_counter()
    run = build()
    warm = None if warmup is None else run(warmup)
    ready = {"build_and_warmup_s": time.perf_counter() - t0, "warmup_result": warm}
    _say({**ready, **(info or {}), **getattr(run, "info", {}), "environment": environment()})
    for line in sys.stdin:
        gc.collect()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        result = run(json.loads(line))
        seconds = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = {"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}
        _say({"seconds": seconds, **cpu, "result": result})
    exit_now(0)


class Variants:
    """One child process per variant (``python -m benchmarks.<name> ... --variant_process=V``), so
    that no variant's threads or caches can slow another's; one runs at a time.

    Children start one after another, each warming up alone (--smoke: all at once). A child's
    stderr goes to ``<out>/logs/<benchmark>-<variant>.log``, and to the console less TensorFlow's
    start-up lines (the launcher's ConsoleFilter: each child printed 3, a failed cuInit among them).
    Its stdout carries the answers, and stays apart: an answer is one line, never cut by a log line.
    """

    def __init__(self, args, names):
        cmd = [sys.executable, "-m", f"benchmarks.{args.benchmark}", *args.argv]
        self.tag, self.procs, self.info = args.benchmark, {}, {}
        self.log_paths = {
            name: os.path.join(args.out, "logs", f"{args.benchmark}-{name}.log") for name in names
        }
        os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
        self._logs = {name: open(path, "a") for name, path in self.log_paths.items()}  # noqa: SIM115
        self._shown = {name: ConsoleFilter() for name in names}
        self.runs: dict[str, list[dict]] = {name: [] for name in names}
        self.times: dict[str, list[float]] = {name: [] for name in names}
        self.last: dict[str, Any] = {}
        try:
            for name in names:
                self.procs[name] = subprocess.Popen(
                    [*cmd, f"{VARIANT_FLAG}={name}"],
                    cwd=REPO,
                    env=child_env(),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                threading.Thread(target=self._pump_stderr, args=(name,), daemon=True).start()
                if not args.smoke:
                    self._ready(name)
            for name in names if args.smoke else ():
                self._ready(name)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Variants:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ready(self, name: str) -> None:
        self.info[name] = self._reply(name)
        self.env = self.info[name].pop("environment")
        seconds = self.info[name]["build_and_warmup_s"]
        print(f"[{self.tag}] {name}: built and warmed up in its process in {seconds:.1f}s")

    def _reply(self, name: str) -> dict:
        for line in self.procs[name].stdout:
            if line.startswith(_REPLY):
                return json.loads(line[len(_REPLY) :])
            print(f"[{self.tag}:{name}] {line}", end="", flush=True)
        code = self.procs[name].wait()
        raise RuntimeError(
            f"[{self.tag}] {name} ended (exit {code}) before answering (see above; its stderr: "
            f"{self.log_paths[name]})"
        )

    def _pump_stderr(self, name: str) -> None:
        for line in self.procs[name].stderr:
            try:
                self._logs[name].write(line)
                self._logs[name].flush()
            except ValueError:  # closed by close(): a child still writing after its last answer
                pass
            if self._shown[name](line.rstrip("\n")):
                print(f"[{self.tag}:{name}] {line}", end="", file=sys.stderr, flush=True)

    def request(self, name: str, request: Any) -> dict:
        """One request to the variant's process; its answer (seconds, CPU, result)."""
        self.procs[name].stdin.write(json.dumps(request) + "\n")
        self.procs[name].stdin.flush()
        self.runs[name].append(self._reply(name))
        return self.runs[name][-1]

    def time(self, steps: int, repeats: int) -> dict[str, list[float]]:
        """`repeats` rounds of `steps` steps per variant, rotating the order (load drift hits all)."""
        names, self.steps = list(self.procs), steps
        for rep in range(repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                reply = self.request(name, steps)
                self.times[name].append(reply["seconds"])
                self.last[name] = reply["result"]
            rates = " ".join(f"{n}={steps / self.times[n][-1]:.1f}" for n in names)
            print(f"[{self.tag}] round {rep + 1}/{repeats}: {rates} steps/s", flush=True)
        return self.times

    def result(self, name: str, **extra) -> dict[str, Any]:
        """The child's info, `summarize` of its timings, `extra`, its CPU ms per step."""
        runs, ms = self.runs[name], 1e3 / self.steps
        cpu = {f"{k}_ms_per_step": statistics.median(r[f"{k}_s"] for r in runs) * ms for k in CPU}
        return {**self.info[name], **summarize(self.times[name], self.steps), **extra, **cpu}

    def environment(self) -> dict[str, Any]:
        """A child's environment (TensorFlow, device) with this process's load average."""
        return {**self.env, **{k: v for k, v in environment().items() if k.startswith("load")}}

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.stdin:
                proc.stdin.close()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self._logs.values():
            log.close()


# -- a local cluster ---------------------------------------------------------------------------------


class LocalCluster:
    """ps and worker tasks on 127.0.0.1 serving as `tfdist-train` serves them (``tfdist_trainer.cli``,
    a TF_CONFIG each), a chief spawned beside them; every process is stopped on the way out."""

    def __init__(self, layout: dict[str, int], run_dir: str, gin_files: list[str]):
        from tfdist_trainer.launch.local_tasks import free_port_cluster

        self.cluster, self.run_dir, self.procs = free_port_cluster(layout), run_dir, {}
        cli = [sys.executable, "-m", "tfdist_trainer.cli", *[f"--gin_file={g}" for g in gin_files]]
        cli += [f"--model_dir={run_dir}/model_dir", "--chief_gone_grace_s=5"]
        try:
            for task_type in ("ps", "worker"):
                for index in range(len(self.cluster.get(task_type, []))):
                    self.spawn(f"{task_type}:{index}", cli, self.env(task_type, index))
        except BaseException:
            self.__exit__()
            raise

    def env(self, task_type: str, index: int) -> dict[str, str]:
        from tfdist_trainer.plan.cluster import tf_config_text

        tf_config = tf_config_text(self.cluster, task_type, index)
        return child_env(TF_CONFIG=tf_config, GRPC_FAIL_FAST="use_caller", PYTHONUNBUFFERED="1")

    def spawn(self, role: str, cmd: list[str], env: dict[str, str]) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        with open(self.log_path(role), "w") as log:
            self.procs[role] = subprocess.Popen(
                cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log_path(self, role: str) -> str:
        return os.path.join(self.run_dir, role.replace(":", "-") + ".log")

    def result(self, role: str, timeout_s: float) -> dict:
        """Waits for `role` to finish; the JSON on its last ``RESULT `` line."""
        try:
            code = self.procs[role].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = "timeout"
        with open(self.log_path(role)) as f:
            log = f.read()
        lines = [line for line in log.splitlines() if line.startswith("RESULT ")]
        if code != 0 or not lines:
            raise RuntimeError(f"{role} ended ({code}) without a result:\n{log[-5000:]}")
        return json.loads(lines[-1][len("RESULT ") :])

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        from tfdist_trainer.launch.process_group import signal_group

        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
            for proc in self.procs.values():
                signal_group(proc, sig)  # the group: whatever the task started stops too
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    pass


def launch_command(
    launch_flags: list[str], model_dir: str, gin_files: list[str], bindings: list[str]
) -> list[str]:
    """``tfdist-launch <launch_flags> -- ...`` of a job: its model_dir, the repository's gin files
    (paths under configs/) and gin bindings."""
    cmd = [sys.executable, "-m", "tfdist_trainer.launch.main", *launch_flags, "--"]
    cmd += [f"--model_dir={model_dir}"]
    cmd += [f"--gin_file={REPO}/configs/{g}" for g in gin_files]
    return cmd + [f"--gin_bindings={b}" for b in bindings]


def launched_job_records(variant: str, cmd: list[str], model_dir: str, timeout_s: float) -> list:
    """Runs one `tfdist-launch` job (`cmd`) to its end; its records (model_dir/metrics.jsonl)."""
    from tfdist_trainer.io.records import read_records

    job = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    if job.returncode != 0:
        raise RuntimeError(
            f"{variant} job exited {job.returncode}:\n{(job.stdout + job.stderr)[-3000:]}"
        )
    return read_records(os.path.join(model_dir, "metrics.jsonl"))


def records_steps_per_s(records: list, warmup_steps: int, where: str) -> float:
    """Steps/s between the first and last train records at or past `warmup_steps`."""
    train = [r for r in records if r.get("kind") == "train" and r["step"] >= warmup_steps]
    if len(train) < 2:
        raise RuntimeError(f"too few train records past step {warmup_steps} in {where}")
    return (train[-1]["step"] - train[0]["step"]) / (train[-1]["time"] - train[0]["time"])


def launched_job_steps_per_s(
    variant: str, cmd: list[str], model_dir: str, warmup_steps: int, timeout_s: float
) -> float:
    """Runs one `tfdist-launch` job (`cmd`) to its end; its steps/s between its first and last
    train records at or past `warmup_steps` (model_dir/metrics.jsonl)."""
    records = launched_job_records(variant, cmd, model_dir, timeout_s)
    return records_steps_per_s(records, warmup_steps, model_dir)


# -- statistics, environment, figures ----------------------------------------------------------------


def summarize(times_s, steps: int) -> dict[str, Any]:
    """Median and spread of repeated timings of `steps` steps."""
    times = list(times_s)
    med = statistics.median(times)
    return {
        "steps": steps,
        "repetitions": len(times),
        "times_s": [round(t, 6) for t in times],
        "time_s_median": med,
        "time_s_min": min(times),
        "time_s_max": max(times),
        "steps_per_s": steps / med,
        "steps_per_s_min": steps / max(times),
        "steps_per_s_max": steps / min(times),
    }


def rate_results(speeds: dict[str, list[float]], unit: str = "steps_per_s") -> dict[str, dict]:
    """Each variant's repeated rates as median, min, max and the runs (`rate_cells` reads them)."""
    return {
        name: {unit: statistics.median(s), f"{unit}_min": min(s), f"{unit}_max": max(s), "runs": s}
        for name, s in speeds.items()
    }


def ratio_spread(numerator, denominator) -> dict[str, float]:
    """Per-repetition ratios (paired: the same round), as median and min..max."""
    ratios = [a / b for a, b in zip(numerator, denominator)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def add_ratios(results: dict, times: dict, baseline: str, kind: str = "speedup") -> None:
    """Each result's ratio to `baseline`: 'speedup' (its time / this time) or 'time_ratio'."""
    for name, r in results.items():
        num, den = (
            (times[baseline], times[name]) if kind == "speedup" else (times[name], times[baseline])
        )
        r[f"{kind}_vs_baseline"] = statistics.median(num) / statistics.median(den)
        r[f"{kind}_vs_baseline_paired"] = ratio_spread(num, den)


def _gpus() -> list[str]:
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return [
            tf.config.experimental.get_device_details(d).get("device_name") or d.name
            for d in tf.config.list_physical_devices("GPU")
        ]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = [smi, "--query-gpu=name", "--format=csv,noheader"]
    out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def environment() -> dict[str, Any]:
    """Python, platform, load, the device (CPU model, GPUs); TF's and Keras' versions once imported."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = _gpus()
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": {
            "cpu_model": cpu,
            "gpus": gpus,
            "summary": f"{', '.join(gpus)} (CPU {cpu})" if gpus else f"CPU only: {cpu}",
        },
        "load_average_1m": os.getloadavg()[0],
    }
    if "tensorflow" in sys.modules:
        import keras
        import tensorflow as tf

        info.update(tensorflow=tf.__version__, keras=keras.__version__)
    return info


def figure(name, value, unit, baseline, ratio, label, reps, spread=None, target=None, key=None):
    """One headline figure: a value, the baseline measured in the same run, the ratio to it and
    what it means, the repetitions, the min..max spread of the ratio, a target (e.g. '>= 1.2x')
    and whether it was met, and a stable `key` for the figures run_all looks up."""
    meets = None
    if target and ratio is not None:
        op, bound_ = target.split()[0], float(target.split()[1].rstrip("x"))
        meets = ratio >= bound_ if op == ">=" else ratio <= bound_
    if isinstance(spread, dict):
        spread = [spread["min"], spread["max"]]
    return {
        "figure": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "ratio_label": label,
        "repetitions": reps,
        "spread": spread,
        "target": target,
        "meets_target": meets,
        "key": key,
    }


# -- the report and the JSON -------------------------------------------------------------------------


def rate_cells(r: dict, fmt: str = ".1f", unit: str = "steps_per_s") -> list[str]:
    """A rate's median and min..max (steps/s, or the `unit` of `rate_results`), for a table row."""
    return [f"{r[unit]:{fmt}}", f"{r[f'{unit}_min']:{fmt}}..{r[f'{unit}_max']:{fmt}}"]


RATE_COLUMNS = ["steps/s", "min..max"]


def figure_line(f: dict) -> str:
    if f["ratio"] is None:
        return f"{f['figure']}: no ratio ({f.get('note', 'missing')})"
    spread = f" (min..max {f['spread'][0]:.3f}..{f['spread'][1]:.3f})" if f["spread"] else ""
    line = f"{f['figure']}: {f['ratio']:.3f} {f['ratio_label']} vs {f['baseline']}{spread}"
    if f["target"]:
        line += f"; target {f['target']}: {'met' if f['meets_target'] else 'NOT met'}"
    return line


def record(args, *, header, columns, rows, left=(0,), notes=(), config=None, **fields) -> dict:
    """Writes ``<--out>/<benchmark>.json`` (benchmark, smoke, command, config, `fields`, figures)
    and prints the report: the environment, `header`, the table, `notes` and each figure."""
    skip = ("argv", "benchmark", "out", "smoke", "variant_process")
    payload = {
        "benchmark": args.benchmark,
        "smoke": args.smoke,
        "command": " ".join([f"python -m benchmarks.{args.benchmark}", *args.argv]),
        "config": {**{k: v for k, v in vars(args).items() if k not in skip}, **(config or {})},
        **fields,
    }
    payload["figures"] = payload.pop("figures", [])
    env = payload["environment"]
    where = [
        env["device"]["summary"],
        f"Python {env['python']}",
        f"load {env['load_average_1m']:.2f}",
    ]
    if env.get("tensorflow"):
        where.insert(1, f"TensorFlow {env['tensorflow']}, Keras {env.get('keras')}")
    table = format_table(columns, rows, left=left)
    lines = ["environment: " + "; ".join(where), header, table, *notes]
    lines += [figure_line(f) for f in payload["figures"]]
    path = write_json(args.out, args.benchmark, payload)
    print("\n" + "\n".join(lines) + f"\n\n[{args.benchmark}] wrote {path}", flush=True)
    return payload


def write_json(out_dir: str, name: str, payload: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    return path
