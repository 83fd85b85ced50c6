"""The demo's result: one table, as text, JSON (written by demo.py) and a PNG bar chart."""

from __future__ import annotations

import json
import os


def _read_records(path: str) -> list[dict]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


def summarize_run(model_dir: str) -> dict:
    """Steps, test accuracy, training examples/s and data label of one finished run (metrics.jsonl)."""
    records = _read_records(os.path.join(model_dir, "metrics.jsonl"))
    train = [r for r in records if r.get("kind") == "train" and r.get("steps_per_s")]
    evals = [r for r in records if r.get("kind") == "eval"]
    # Examples over the seconds spent in training steps: each record covers the steps since the last.
    seconds = examples = 0.0
    previous = 0
    for r in train:
        steps = r["step"] - previous
        previous = r["step"]
        seconds += steps / r["steps_per_s"]
        examples += steps * r["examples_per_s"] / r["steps_per_s"]
    last = (evals or train or [{}])[-1]
    return {
        "steps": max([r.get("step", 0) for r in records], default=0),
        "test_accuracy": evals[-1].get("eval_accuracy") if evals else None,
        "examples_per_s": examples / seconds if seconds else None,
        "data": last.get("data"),
    }


def format_table(rows: list[dict]) -> list[str]:
    headers = (
        "strategy",
        "tasks",
        "data source",
        "steps",
        "test accuracy",
        "wall time",
        "examples/s",
    )

    def cells(r):
        acc, eps = r["test_accuracy"], r["examples_per_s"]
        return (
            r["strategy"],
            r["tasks"],
            r["data_short"],
            str(r["steps"]),
            "-" if acc is None else f"{acc:.4f}",
            f"{r['wall_time_s']:.1f}s",
            "-" if eps is None else f"{eps:,.0f}",
        )

    table = [headers] + [cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    numeric = {3, 4, 5, 6}

    def fmt(row):
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in table[1:]]


def write_chart(path: str, rows: list[dict], title: str) -> str | None:
    """A PNG bar chart (test accuracy and examples/s per strategy); None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [r["strategy"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    accuracies = [r["test_accuracy"] or 0.0 for r in rows]
    left.barh(names, accuracies, color="#4c72b0")
    left.set_xlim(0, 1)
    left.set_title("test accuracy")
    left.invert_yaxis()  # the first run on top, as in the table
    for y, value in enumerate(accuracies):
        left.text(value, y, f"{value:.4f} ", va="center", ha="right", color="white")
    speeds = [r["examples_per_s"] or 0.0 for r in rows]
    right.barh(names, speeds, color="#55a868")
    right.set_title("training examples/s")
    right.set_yticks([])
    right.invert_yaxis()
    for y, value in enumerate(speeds):
        right.text(value, y, f"{value:,.0f} ", va="center", ha="right", color="white")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
