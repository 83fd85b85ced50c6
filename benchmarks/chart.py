"""The PNG chart of `make bench`: every headline figure's ratio to its baseline, with its spread.

One horizontal bar per figure (ratio to the baseline named beside it), an
error bar from the spread over repetitions, a dashed line at 1.0 (as fast as
the baseline) and a marker at the figure's target where it has one. Ratios
whose meaning is "lower is better" (time ratios, fractions) are labelled so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

LOWER_IS_BETTER = ("time ratio", "fraction", "share")  # ratio_label prefixes where lower is better


def _target_value(target: str | None) -> float | None:
    match = re.search(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", target or "")
    return float(match.group()) if match else None


def write_chart(figures: Sequence[dict[str, Any]], path: str, title: str) -> str | None:
    """Writes the chart to `path` and returns it; None when there is nothing with a ratio to draw."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to a file
    import matplotlib.pyplot as plt

    rows = [f for f in figures if f.get("ratio") is not None and f.get("ratio_label") != "fraction"]
    if not rows:
        return None
    height = 1.0 + 0.42 * len(rows)
    fig, ax = plt.subplots(figsize=(15, height))
    ys = list(range(len(rows)))[::-1]
    for y, f in zip(ys, rows):
        ratio = f["ratio"]
        met = f.get("meets_target")
        color = "#2e7d32" if met else "#c62828" if met is False else "#1565c0"
        ax.barh(y, ratio, color=color, alpha=0.8, height=0.6)
        if f.get("spread"):
            lo, hi = f["spread"]
            ax.errorbar(
                ratio,
                y,
                xerr=[[max(ratio - lo, 0)], [max(hi - ratio, 0)]],
                fmt="none",
                ecolor="black",
                capsize=3,
                lw=1,
            )
        target = _target_value(f.get("target"))
        if target is not None:
            ax.plot([target], [y], marker="|", markersize=16, color="black", mew=2)
        better = (
            "lower is better"
            if f["ratio_label"].startswith(LOWER_IS_BETTER)
            else "higher is better"
        )
        # the label starts right of the whisker
        right = max(ratio, *(f.get("spread") or [0]), target or 0)
        ax.text(right, y, f"  {ratio:.2f} ({f['ratio_label']}, {better})", va="center", fontsize=7)
    ax.set_yticks(ys)
    ax.set_yticklabels(
        [
            f"{f['benchmark']}: {f['figure']}\nvs {f['baseline']} (n={f['repetitions']})"
            for f in rows
        ],
        fontsize=7,
    )
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    highest = max(
        max(f["ratio"], *(f.get("spread") or [0]), _target_value(f.get("target")) or 0)
        for f in rows
    )
    ax.set_xlim(0, highest * 1.45)  # room for the labels right of the bars
    ax.set_xlabel(
        "ratio to the baseline measured in the same run\n(bar: median; whisker: min..max over "
        "repetitions; |: target; green: target met, red: not met, blue: no target)"
    )
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
