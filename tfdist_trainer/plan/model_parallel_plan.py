"""Model-parallel plans, parsed and checked before TensorFlow starts.

A plan maps layers to device indices: a dict or a list of ``(regex, index)``
pairs matched against layer paths, or ``'auto'`` (contiguous stages of about
equal parameter bytes). `tfdist_trainer.runtime.strategies.model_parallel.placement`
applies a parsed plan to a built model; see its docstring for the rules.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tfdist_trainer.errors import ConfigError

AUTO = "auto"


class Rule:
    """One ``(pattern, device index)`` entry of a plan."""

    def __init__(self, pattern: str, index: int):
        self.pattern = pattern
        self.index = index
        self.regex = re.compile(pattern)

    def matches(self, path: str) -> bool:
        return self.regex.fullmatch(path) is not None

    def __repr__(self) -> str:
        return f"({self.pattern!r}, {self.index})"


def parse_plan(
    plan: Any, *, num_devices: int, knob: str = "model_parallel.plan"
) -> str | list[Rule]:
    """'auto', or the plan's rules in order; a malformed plan or a device index >= num_devices is a ValueError."""
    if isinstance(plan, str):
        if plan.lower() == AUTO:
            return AUTO
        raise ConfigError(
            f"{knob} must be 'auto', a dict {{layer regex: device index}} or a list of "
            f"(layer regex, device index) pairs, got {plan!r}."
        )
    if isinstance(plan, dict):
        pairs = list(plan.items())
    elif isinstance(plan, (list, tuple)):
        pairs = []
        for entry in plan:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                raise ConfigError(
                    f"{knob} entries must be (layer regex, device index) pairs, got {entry!r}."
                )
            pairs.append(tuple(entry))
    else:
        raise ConfigError(
            f"{knob} must be 'auto', a dict {{layer regex: device index}} or a list of "
            f"(layer regex, device index) pairs, got {plan!r}."
        )
    if not pairs:
        raise ConfigError(f"{knob} is empty; name at least one layer pattern, or use 'auto'.")
    rules = []
    for pattern, index in pairs:
        if not isinstance(pattern, str):
            raise ConfigError(f"{knob}: layer pattern {pattern!r} is not a string.")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(
                f"{knob}: device index {index!r} for layer pattern {pattern!r} must be an "
                f"integer >= 0."
            )
        if index >= num_devices:
            raise ConfigError(
                f"{knob} puts layer pattern {pattern!r} on device {index}, but "
                f"model_parallel.num_devices={num_devices} gives devices 0..{num_devices - 1}; "
                f"raise num_devices or fix the plan."
            )
        try:
            rules.append(Rule(pattern, index))
        except re.error as e:
            raise ConfigError(
                f"{knob}: layer pattern {pattern!r} is not a valid regular expression ({e})."
            ) from None
    return rules


def balance_contiguous(sizes: Sequence[float], num_stages: int) -> list[int]:
    """Stage index of each item: at most `num_stages` contiguous, non-empty stages, minimizing the largest.

    The classic linear-partition dynamic programme (exact; O(n^2 k) for n items).
    With fewer items than stages, each item gets its own stage.
    """
    n = len(sizes)
    if n == 0:
        return []
    k = max(1, min(num_stages, n))
    prefix = [0.0]
    for s in sizes:
        prefix.append(prefix[-1] + float(s))

    def cost(i: int, j: int) -> float:  # items i..j-1
        return prefix[j] - prefix[i]

    inf = float("inf")
    # best[s][j]: the smallest possible largest stage when items 0..j-1 form s stages.
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], cost(i, j))
                # On ties prefer the later cut: earlier stages take the extra (parameter-free) layers.
                if value <= best[s][j]:
                    best[s][j], cut[s][j] = value, i
    stages = [0] * n
    j = n
    for s in range(k, 0, -1):
        i = cut[s][j]
        for t in range(i, j):
            stages[t] = s - 1
        j = i
    return stages


def short_device(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> 'CPU:1' (keeps the task when it is not local)."""
    match = re.search(r"device:([A-Za-z_]+):(\d+)", name or "")
    if not match:
        return name or "?"
    dev = f"{match.group(1).upper()}:{match.group(2)}"
    job = re.search(r"/job:([^/]+)", name)
    task = re.search(r"/task:(\d+)", name)
    if job and job.group(1) != "localhost" and task:
        return f"{job.group(1)}:{task.group(1)}/{dev}"
    return dev


# -- 'auto' on a tree of layers ----------------------------------------------------------

#: 'auto' stops splitting once every device holds its fair share of bytes within this fraction.
BALANCE_TOLERANCE = 0.10


class PlanItem:
    """One contiguous piece 'auto' may give to a stage: a layer's whole subtree, or only its own variables.

    ``node`` is any object with ``path``, ``own_bytes`` (its variables no sublayer
    holds), ``total_bytes`` (with its sublayers') and ``children`` (its sublayers in
    call order). An expanded layer leaves an ``own`` item in front of its
    children: its own variables and the ops it runs between its sublayers' calls.
    """

    def __init__(self, node: Any, *, own: bool = False):
        self.node = node
        self.own = own

    @property
    def bytes(self) -> int:
        return self.node.own_bytes if self.own else self.node.total_bytes

    @property
    def splittable(self) -> bool:
        """Whether expanding it gives finer pieces: some sublayer holds bytes."""
        return not self.own and any(child.total_bytes > 0 for child in self.node.children)

    def __repr__(self) -> str:
        return f"{self.node.path}{' (own)' if self.own else ''}: {self.bytes}"


def _expand(items: list[PlanItem], item: PlanItem) -> list[PlanItem]:
    at = items.index(item)
    return (
        items[:at]
        + [PlanItem(item.node, own=True)]
        + [PlanItem(c) for c in item.node.children]
        + items[at + 1 :]
    )


def stage_bytes(items: Sequence[PlanItem], stages: Sequence[int], num_stages: int) -> list[int]:
    totals = [0] * num_stages
    for item, stage in zip(items, stages):
        totals[stage] += item.bytes
    return totals


def is_balanced(totals: Sequence[int], tolerance: float = BALANCE_TOLERANCE) -> bool:
    """Every stage holds its fair share of bytes within `tolerance` (a fraction of the fair share)."""
    fair = sum(totals) / max(1, len(totals))
    return all(abs(t - fair) <= tolerance * fair for t in totals)


def auto_stages(
    top: Sequence[Any], num_stages: int, tolerance: float = BALANCE_TOLERANCE
) -> tuple[list[PlanItem], list[int]]:
    """'auto': contiguous stages in call order, descending into nested layers until they balance.

    Starts from the model's own layers (`top`, in call order). Every piece that
    holds more than a stage's fair share of bytes is expanded into its sublayers
    (a backbone into its blocks), then, while some stage is off its fair share by
    more than `tolerance`, the largest piece that can still be split is expanded
    and the cut recomputed (`balance_contiguous`, exact for a given list). Stops
    balanced, or when only leaf layers are left (the caller reports how close it
    got). Returns (items in call order, stage of each item).
    """
    items = [PlanItem(node) for node in top]
    total = sum(item.bytes for item in items)
    fair = total / max(1, num_stages)
    while True:
        too_big = [it for it in items if it.splittable and it.bytes > fair]
        if not too_big:
            break
        for item in too_big:
            items = _expand(items, item)
    while True:
        stages = balance_contiguous([it.bytes for it in items], num_stages)
        splittable = [it for it in items if it.splittable]
        if not splittable or is_balanced(stage_bytes(items, stages, num_stages), tolerance):
            return _collapse(items, stages)
        items = _expand(items, max(splittable, key=lambda it: it.bytes))


def _collapse(items: list[PlanItem], stages: list[int]) -> tuple[list[PlanItem], list[int]]:
    """Undoes every expansion whose pieces all landed on one stage (innermost first): same stages,
    fewer rows, and a layer kept whole runs all its ops on its device."""
    items, stages = list(items), list(stages)
    changed = True
    while changed:
        changed = False
        for start in reversed(range(len(items))):
            if not items[start].own:
                continue
            prefix = items[start].node.path + "/"
            end = start + 1
            while end < len(items) and items[end].node.path.startswith(prefix):
                end += 1
            if len(set(stages[start:end])) == 1:
                items[start:end] = [PlanItem(items[start].node)]
                stages[start:end] = [stages[start]]
                changed = True
                break
    return items, stages
