"""`make demo`: MNIST on a local multi-process cluster, under two strategies.

Runs `tfdist-launch` twice: parameter_server (chief + 2 workers + 1 ps), then
multi_worker_mirrored (2 workers), and prints the test accuracy of each. On a
machine without MNIST (no TFDS copy, no IDX files) it says so once and trains
on the labelled offline digits set instead; every line it prints then
carries that label.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from absl import app, flags

from recipes.mnist import data as mnist_data

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "model_dir", None, "Where the two runs write; default: a new temporary directory."
)
flags.DEFINE_integer("train_steps", 1000, "Training steps of each run.")
flags.DEFINE_string("idx_dir", None, "A directory with the four MNIST IDX files, if you have them.")
flags.DEFINE_string("tfds_data_dir", None, "A TFDS data directory in which mnist is prepared.")
flags.DEFINE_boolean("verbose", False, "Show every line the tasks print.")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUNS = (
    ("parameter_server", "chief + 2 workers + 1 ps", ["--num_workers=2", "--num_ps=1"]),
    ("multi_worker_mirrored", "2 workers", ["--num_workers=2"]),
)


def _data_label() -> str:
    _, label = mnist_data.load_mnist(
        "test", idx_dir=FLAGS.idx_dir, tfds_data_dir=FLAGS.tfds_data_dir
    )
    return label


_ABSL_PREFIX = re.compile(r"^(\[[a-z]+:\d+\]) [IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")


def _shown(line: str) -> str | None:
    """The part of a task's line worth showing in the demo (progress, eval, errors), or None."""
    if FLAGS.verbose:
        return line
    if "controller.py" in line or "error" in line.lower() or "[launch] job" in line:
        return _ABSL_PREFIX.sub(r"\1 ", line)
    return None


def main(argv):
    del argv
    label = _data_label()
    tag = "[OFFLINE FALLBACK, not MNIST] " if label == mnist_data.FALLBACK_LABEL else ""
    if tag:
        print(
            f"{tag}Neither TFDS mnist nor MNIST IDX files are on this machine, so this demo trains on "
            f"the offline scikit-learn digits set; pass --idx_dir or --tfds_data_dir for real MNIST."
        )
    root = FLAGS.model_dir or tempfile.mkdtemp(prefix="tfdist_demo_")
    summary = []
    for strategy, shape, launch_args in RUNS:
        model_dir = os.path.join(root, strategy)
        bindings = [f"--gin_bindings=train.train_steps={FLAGS.train_steps}"]
        if FLAGS.idx_dir:
            bindings.append(f"--gin_bindings=MnistTrainer.idx_dir='{FLAGS.idx_dir}'")
        if FLAGS.tfds_data_dir:
            bindings.append(f"--gin_bindings=MnistTrainer.tfds_data_dir='{FLAGS.tfds_data_dir}'")
        cmd = [
            sys.executable,
            "-m",
            "tfdist_trainer.launch",
            *launch_args,
            "--",
            f"--gin_file={REPO}/configs/mnist.gin",
            f"--gin_file={REPO}/configs/strategies/{strategy}.gin",
            f"--model_dir={model_dir}",
            *bindings,
        ]
        print(
            f"{tag}== {strategy} ({shape}), {FLAGS.train_steps} steps, model_dir={model_dir}",
            flush=True,
        )
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
        )
        for line in proc.stdout:
            shown = _shown(line.rstrip())
            if shown is not None:
                print(shown if "FALLBACK" in shown else f"{tag}{shown}", flush=True)
        if proc.wait() != 0:
            print(
                f"{tag}{strategy} failed with exit code {proc.returncode}; see {model_dir}/logs/",
                flush=True,
            )
            sys.exit(proc.returncode)
        from tfdist_trainer.logs import read_records

        evals = [
            r
            for r in read_records(os.path.join(model_dir, "metrics.jsonl"))
            if r.get("kind") == "eval"
        ]
        accuracy = evals[-1]["eval_accuracy"] if evals else float("nan")
        summary.append(
            f"{tag}{strategy:>22} ({shape}): test accuracy {accuracy:.4f} at step "
            f"{evals[-1]['step'] if evals else '?'} on {label}"
        )
    print(f"{tag}== results")
    for line in summary:
        print(line)


if __name__ == "__main__":
    app.run(main)
