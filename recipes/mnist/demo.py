"""`make demo`: MNIST on a local multi-process cluster, under two strategies.

First finds MNIST once, before any task starts (recipes/mnist/prepare.py):
``--idx_dir``, a prepared TFDS copy, the download cache, or one short
download attempt. Offline, it says so in one sentence and trains on the
labelled offline digits set instead. Then it runs ``tfdist-launch`` twice:
parameter_server (chief + 2 workers + 1 ps), then multi_worker_mirrored
(2 workers); each task reads exactly the source found. The console shows
each task's progress, warnings and errors (tfdist_trainer.launch.console; the
per-task logs under ``<model_dir>/<strategy>/logs/`` keep every line), every
line says which data it is about, and the demo ends with one table, also
written as ``results.json`` and ``results.png`` in its output directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from recipes.mnist import prepare, results
from tfdist_trainer.launch import console

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model_dir", None, "Where the runs and the results go; default: a new temporary directory."
)
flags.DEFINE_integer("train_steps", 1000, "Training steps of each run.")
flags.DEFINE_list(
    "strategies",
    ["parameter_server", "multi_worker_mirrored"],
    "Which runs, in order (parameter_server, multi_worker_mirrored).",
)
flags.DEFINE_string("idx_dir", None, "A directory with the four MNIST IDX files, if you have them.")
flags.DEFINE_string("tfds_data_dir", None, "A TFDS data directory in which mnist is prepared.")
flags.DEFINE_string(
    "cache_dir",
    None,
    "Where downloaded MNIST IDX files are kept; default: ~/.cache/tfdist_trainer/mnist.",
)
flags.DEFINE_boolean("download", True, "Try to download MNIST when no copy is on this machine.")
flags.DEFINE_string(
    "mnist_url", prepare.MNIST_URL, "Where the four gzipped IDX files are fetched from."
)
flags.DEFINE_float(
    "download_timeout_s",
    prepare.DEFAULT_TIMEOUT_S,
    "Seconds the download may wait for the server before the demo falls back.",
)
flags.DEFINE_boolean("verbose", False, "Show every line the tasks print.")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: strategy -> (its tasks in words, tfdist-launch flags)
RUNS = {
    "parameter_server": ("chief + 2 workers + 1 ps", ["--num_workers=2", "--num_ps=1"]),
    "multi_worker_mirrored": ("2 workers", ["--num_workers=2"]),
}

#: The launcher's own lines the demo leaves out: the task list, pids and the "finished" lines.
_LAUNCH_DETAIL = re.compile(r"^\[launch\] (started |finished: |\w+: \w+:\d+)")


def _labelled(line: str, prepared: prepare.Prepared) -> str:
    """The line, ending with the data it is about in a few words.

    The tasks' progress lines carry the full label (as metrics.jsonl does); on
    the console it is shortened. A line naming other data than the demo
    prepared keeps its own label, so that a mismatch shows.
    """
    tag = f"[data: {prepared.short_label}]"
    full = f"[data: {prepared.label}]"
    if full in line:
        return line.replace(full, tag)
    return line if "[data: " in line else f"{line} {tag}"


def _run(strategy: str, root: str, prepared: prepare.Prepared, say) -> dict:
    shape, launch_args = RUNS[strategy]
    model_dir = os.path.join(root, strategy)
    cmd = [
        sys.executable,
        "-m",
        "tfdist_trainer.launch.main",
        *launch_args,
        # absl's header on task lines: the demo picks progress lines by their source file
        "--console_format=absl",
        *(["--console_chatter"] if FLAGS.verbose else []),
        "--",
        f"--gin_file={REPO}/configs/mnist.gin",
        f"--gin_file={REPO}/configs/strategies/{strategy}.gin",
        f"--model_dir={model_dir}",
        f"--gin_bindings=train.train_steps={FLAGS.train_steps}",
        *prepared.gin_bindings(),
    ]
    say(f"== {strategy} ({shape}), {FLAGS.train_steps} steps; task logs: {model_dir}/logs/")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    # Progress and eval lines (run_context.py) and the end of training (controller.py).
    shown = console.ConsoleFilter(info_from=("controller.py", "run_context.py"))
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        keep = shown(line)  # every line, so that the filter follows multi-line records
        if FLAGS.verbose:
            print(line, flush=True)
        elif keep and not _LAUNCH_DETAIL.match(line):
            print(_labelled(console.strip_header(line), prepared), flush=True)
    code = proc.wait()
    wall = time.monotonic() - start
    if code != 0:
        say(f"{strategy} failed with exit code {code}; see {model_dir}/logs/")
        sys.exit(code)
    run = results.summarize_run(model_dir)
    return {
        "strategy": strategy,
        "tasks": shape,
        "data": run.pop("data") or prepared.label,
        "data_short": prepared.short_label,
        **run,
        "wall_time_s": round(wall, 2),
    }


def main(argv):
    del argv
    start = time.monotonic()
    unknown = [s for s in FLAGS.strategies if s not in RUNS]
    if unknown:
        raise app.UsageError(f"--strategies: unknown {unknown}; choose from {', '.join(RUNS)}.")
    prepared = prepare.prepare_mnist(
        idx_dir=FLAGS.idx_dir,
        tfds_data_dir=FLAGS.tfds_data_dir,
        cache_dir=FLAGS.cache_dir,
        base_url=FLAGS.mnist_url,
        timeout_s=FLAGS.download_timeout_s,
        download=FLAGS.download,
    )

    def say(text: str) -> None:
        print(_labelled(f"[demo] {text}", prepared), flush=True)

    if prepared.is_mnist:
        say(f"data: {prepared.how} ({prepared.seconds:.1f}s)")
    else:
        say(
            f"Neither TFDS mnist nor MNIST IDX files are on this machine and none could be fetched "
            f"({prepared.how}; {prepared.seconds:.1f}s), so this demo trains on the offline "
            f"scikit-learn digits set; pass --idx_dir or --tfds_data_dir for real MNIST."
        )
    root = FLAGS.model_dir or tempfile.mkdtemp(prefix="tfdist_demo_")
    os.makedirs(root, exist_ok=True)
    rows = [_run(strategy, root, prepared, say) for strategy in FLAGS.strategies]

    total = time.monotonic() - start
    say("results")
    for line in results.format_table(rows):
        print(line, flush=True)
    summary = {
        "data": prepared.label,
        "data_source": prepared.source,
        "data_found": prepared.how,
        "data_preparation_s": round(prepared.seconds, 2),
        "train_steps": FLAGS.train_steps,
        "runs": rows,
        "total_wall_time_s": round(total, 2),
    }
    json_path = os.path.join(root, "results.json")
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    png = results.write_chart(
        os.path.join(root, "results.png"),
        rows,
        f"tfdist_trainer MNIST demo: {prepared.short_label}",
    )
    if png:
        say(f"wrote {json_path} and {png}")
    else:
        say(
            f"wrote {json_path}; matplotlib is not installed, so no results.png (pip install matplotlib)"
        )
    say(f"total wall time {total:.1f}s (finding the data {prepared.seconds:.1f}s)")


if __name__ == "__main__":
    app.run(main)
