"""The PNG chart of `make bench`: each figure's ratio to its baseline, its spread and target."""

from __future__ import annotations

import re

LOWER_IS_BETTER = ("time ratio",)  # ratio labels for which lower is better


def write_chart(figures, path: str, title: str) -> str | None:
    """One bar per figure (ratio), whiskers min..max, | at the target; None with nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [f for f in figures if f.get("ratio") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(15, 1.0 + 0.42 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    right_edge = 1.0
    for y, f in zip(ys, rows):
        ratio, met, spread = f["ratio"], f.get("meets_target"), f.get("spread")
        color = {True: "#2e7d32", False: "#c62828", None: "#1565c0"}[met]
        ax.barh(y, ratio, color=color, alpha=0.8, height=0.6)
        if spread:
            whiskers = [[max(ratio - spread[0], 0)], [max(spread[1] - ratio, 0)]]
            ax.errorbar(ratio, y, xerr=whiskers, fmt="none", ecolor="black", capsize=3, lw=1)
        number = re.search(r"\d*\.?\d+", f.get("target") or "")
        target = float(number.group()) if number else 0
        if number:
            ax.plot([target], [y], marker="|", markersize=16, color="black", mew=2)
        better = "lower" if f["ratio_label"].startswith(LOWER_IS_BETTER) else "higher"
        right = max(ratio, *(spread or [0]), target)
        right_edge = max(right_edge, right)
        label = f"  {ratio:.2f} ({f['ratio_label']}, {better} is better)"
        ax.text(right, y, label, va="center", fontsize=7)
    ax.set_yticks(ys)
    names = [
        f"{f['benchmark']}: {f['figure']}\nvs {f['baseline']} (n={f['repetitions']})" for f in rows
    ]
    ax.set_yticklabels(names, fontsize=7)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set_xlim(0, right_edge * 1.45)
    ax.set_xlabel(
        "ratio to the baseline measured in the same run (bar: median; whisker: min..max; |: target;"
        " green: met, red: not met, blue: no target)"
    )
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
