"""`make demo` (recipes/mnist/demo.py), run for real with few steps and one strategy per case.

Offline (the download URL is a closed port on 127.0.0.1): it falls back at
once with its one-sentence notice. With MNIST IDX files served by a local HTTP
server: it downloads them once, before the cluster starts, and the tasks train
on that copy. Both times every line says which data it is about, the console
has no TensorFlow chatter and no doubled prefixes, and the run ends with the
results table, results.json and, where matplotlib is installed (`make demo` installs
the charts extra; `make test` does not), results.png.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import pytest
from clusterlib import HAS_MATPLOTLIB
from test_mnist_data import LocalServer, closed_port_url, write_fake_mnist

from recipes.mnist import data, prepare, results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20
CHATTER = ("cuInit", "InitializeLog", "oneDNN", "cuda drivers", "Heartbeat", "session config")


def _run_demo(tmp_path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "recipes.mnist.demo",
        f"--model_dir={out}",
        f"--train_steps={STEPS}",
        f"--cache_dir={tmp_path / 'cache'}",
        f"--tfds_data_dir={tmp_path / 'no_tfds'}",  # never the machine's own copy
        *args,
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400, check=False
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console[-6000:]
    with open(out / "results.json") as f:
        return console, json.load(f)


def _check_console(console: str, tag: str) -> list[str]:
    lines = [line for line in console.splitlines() if line.strip()]
    table = [i for i, line in enumerate(lines) if line.startswith("strategy ")]
    assert len(table) == 1, console
    header = {table[0], table[0] + 1}  # the table's header and rule
    for i, line in enumerate(lines):
        if i not in header:
            assert tag in line, f"line without its data label: {line!r}\n{console}"
        assert not re.match(r"^\[[^\]]+\] \[[\w:]+\]", line), f"two prefixes: {line!r}"
        assert not any(word in line for word in CHATTER), f"chatter on the console: {line!r}"
    assert re.search(rf"^\[\w+:0\] step {STEPS}/{STEPS} loss=", console, re.M), console
    assert re.search(r"^\[demo\] total wall time \d+\.\ds", console, re.M), console
    return lines


def _check_png(path: str) -> None:
    with open(path, "rb") as f:
        content = f.read()
    assert content[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", content[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", content[16:24])
    assert width > 100 and height > 100
    assert zlib.crc32(content[12:29]) == struct.unpack(">I", content[29:33])[0]
    assert content.rstrip(b"\x00")[-8:-4] == b"IEND"


def _check_results(summary: dict, strategy: str, data_label: str, out: str, console: str) -> None:
    assert summary["data"] == data_label
    assert summary["train_steps"] == STEPS and summary["total_wall_time_s"] > 0
    (run,) = summary["runs"]
    assert set(run) >= {
        "strategy",
        "tasks",
        "data",
        "steps",
        "test_accuracy",
        "wall_time_s",
        "examples_per_s",
    }
    assert run["strategy"] == strategy and run["steps"] == STEPS
    assert run["data"] == data_label  # what the tasks themselves recorded in metrics.jsonl
    assert 0.0 <= run["test_accuracy"] <= 1.0
    assert run["examples_per_s"] > 0 and 0 < run["wall_time_s"] <= summary["total_wall_time_s"]
    png = os.path.join(out, "results.png")
    if HAS_MATPLOTLIB:
        _check_png(png)
    else:
        assert not os.path.exists(png)
        assert "matplotlib is not installed, so no results.png (pip install matplotlib)" in console
        assert "[demo] wrote " in console, console


@pytest.mark.cluster
def test_offline_demo_falls_back_at_once_and_labels_every_line(tmp_path):
    console, summary = _run_demo(
        tmp_path, f"--mnist_url={closed_port_url()}", "--strategies=multi_worker_mirrored"
    )
    lines = _check_console(console, "OFFLINE FALLBACK")
    notices = [line for line in lines if "Neither TFDS mnist nor MNIST IDX files" in line]
    assert len(notices) == 1 and "Connection refused" in notices[0], console
    assert summary["data_source"] == "digits" and summary["data_preparation_s"] < 2.0
    _check_results(
        summary, "multi_worker_mirrored", prepare.FALLBACK_LABEL, str(tmp_path / "out"), console
    )
    assert not os.listdir(tmp_path / "cache")


@pytest.mark.cluster
def test_demo_downloads_mnist_once_and_the_tasks_train_on_it(tmp_path):
    served = tmp_path / "served"
    write_fake_mnist(str(served), num_train=512, num_test=128)
    server = LocalServer(str(served))
    try:
        console, summary = _run_demo(
            tmp_path, f"--mnist_url={server.url}", "--strategies=parameter_server"
        )
    finally:
        server.close()
    _check_console(console, "MNIST (IDX)")
    assert "FALLBACK" not in console and "Neither TFDS" not in console
    label = prepare.idx_label(str(tmp_path / "cache"))
    assert summary["data_source"] == "idx"
    _check_results(summary, "parameter_server", label, str(tmp_path / "out"), console)


@pytest.mark.cluster
def test_a_task_failure_reaches_the_demo_console(tmp_path):
    """Corrupt IDX files: the tasks' traceback and the exit code are shown, never filtered away."""
    idx_dir = tmp_path / "idx"
    write_fake_mnist(str(idx_dir), num_train=256, num_test=64)
    # The header promises 256 labels; 10 bytes follow.
    (idx_dir / "train-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(struct.pack(">ii", data.LABELS_MAGIC, 256) + bytes(10))
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.mnist.demo",
            f"--model_dir={tmp_path / 'out'}",
            f"--train_steps={STEPS}",
            f"--idx_dir={idx_dir}",
            f"--tfds_data_dir={tmp_path / 'no_tfds'}",
            "--strategies=multi_worker_mirrored",
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 1, console[-4000:]
    assert re.search(r"^\[worker:\d\] Traceback \(most recent call last\):", console, re.M), console
    assert re.search(r"^\[worker:\d\] ValueError: IDX file .*train-labels", console, re.M), console
    assert re.search(r"^\[launch\] worker:\d exited with code 1", console, re.M), console
    assert "[demo] multi_worker_mirrored failed with exit code 1" in console
    assert not os.path.exists(tmp_path / "out" / "results.json")


def test_results_table_and_chart_without_matplotlib(tmp_path, monkeypatch):
    rows = [
        {
            "strategy": "parameter_server",
            "tasks": "chief + 2 workers + 1 ps",
            "data_short": "MNIST (IDX)",
            "steps": 1000,
            "test_accuracy": 0.98765,
            "wall_time_s": 41.234,
            "examples_per_s": 4321.5,
        },
        {
            "strategy": "multi_worker_mirrored",
            "tasks": "2 workers",
            "data_short": "MNIST (IDX)",
            "steps": 1000,
            "test_accuracy": None,
            "wall_time_s": 30.0,
            "examples_per_s": None,
        },
    ]
    table = results.format_table(rows)
    assert table[0].split()[:2] == ["strategy", "tasks"] and set(table[1]) <= {"-", " "}
    assert "0.9877" in table[2] and "41.2s" in table[2] and "4,322" in table[2]
    assert table[3].split()[-3:] == ["-", "30.0s", "-"]
    if HAS_MATPLOTLIB:
        _check_png(results.write_chart(str(tmp_path / "a.png"), rows, "title"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert results.write_chart(str(tmp_path / "b.png"), rows, "title") is None
    assert not (tmp_path / "b.png").exists()


def test_the_demo_driver_starts_no_tensorflow():
    """It finds the data and reads the results in plain Python: none of TF's start-up lines."""
    code = (
        "import sys\nimport recipes.mnist.demo, recipes.mnist.prepare, recipes.mnist.results\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
