"""What a placement says about itself: the console's lines, the log's table, placement.json.

Kept apart from the deciding (`placement.Placement`) because it is read-only and large: a
12-block model has hundreds of placed pieces. The console gets one line per device
(`stage_lines`), the task's log the whole table (`table_lines`, through
`runtime.logs.layer_table`, which the launcher's console keeps off the console), and
``placement.json`` every variable's real device (`report`).
"""

from __future__ import annotations

import math
from typing import Any

from tfdist_trainer.plan.model_parallel_plan import AUTO, Rule, short_device
from tfdist_trainer.runtime.logs import layer_table
from tfdist_trainer.runtime.strategies.model_parallel.layer_tree import Node
from tfdist_trainer.variables import device_of, format_bytes, stored_bytes


class PlacementReport:
    """The reporting half of `placement.Placement` (a mixin: it reads the placement's state).

    Reads `devices`, `plan`, `units`, `moved`, `warnings` and `misplaced()` of the placement
    it is mixed into, and writes nothing.
    """

    devices: list[str]
    plan: str | list[Rule]
    moved: list[str]
    warnings: list[str]
    units: list[Node]

    def _unit_variables(self, unit: Node) -> list:
        """A row's variables: its own and those of every sublayer that runs inside its scope."""
        found = []
        for node in unit.walk():
            if node is unit or self._placed_by(node) is unit:
                found.extend(node.own_variables)
        return found

    def _placed_by(self, node: Node) -> Node | None:
        while node is not None and not node.unit:
            node = node.parent
        return node

    def _unit_bytes(self, unit: Node) -> int:
        return sum(stored_bytes(v) for v in self._unit_variables(unit))

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for unit in self.units:
            variables = self._unit_variables(unit)
            rows.append(
                {
                    "layer": unit.path,
                    "device_index": unit.index,
                    "device": self.devices[unit.index] if unit.index is not None else None,
                    "rule": unit.rule.pattern if unit.rule else None,
                    "params": sum(int(math.prod(int(d) for d in v.shape)) for v in variables),
                    "bytes": sum(stored_bytes(v) for v in variables),
                    "reused_by": list(unit.reused_by),
                    "variables": [{"name": v.path, "device": device_of(v)} for v in variables],
                }
            )
        return rows

    def per_device(self) -> list[dict[str, Any]]:
        totals = [
            {"device_index": i, "device": d, "params": 0, "bytes": 0, "layers": []}
            for i, d in enumerate(self.devices)
        ]
        for row in self.rows():
            if row["device_index"] is None:
                continue
            total = totals[row["device_index"]]
            total["params"] += row["params"]
            total["bytes"] += row["bytes"]
            total["layers"].append(row["layer"])
        return totals

    def _plan_text(self) -> str:
        if self.plan == AUTO:
            return (
                "'auto' (contiguous stages in call order, nested layers split, balanced by bytes)"
            )
        return repr(self.plan)

    def stage_lines(self) -> list[str]:
        """The console's view: one line per device (first and last layer, params, bytes, share)."""
        per_device = self.per_device()
        total = sum(d["bytes"] for d in per_device) or 1
        lines = [
            f"model_parallel placement over {len(self.devices)} device(s), plan {self._plan_text()}:"
        ]
        for d in per_device:
            layers = d["layers"]
            span = (
                "no layers"
                if not layers
                else layers[0]
                if len(layers) == 1
                else f"{layers[0]} .. {layers[-1]} ({len(layers)} pieces)"
            )
            lines.append(
                f"  {short_device(d['device'])}: {span}; {d['params']:,} params, "
                f"{format_bytes(d['bytes'])} ({100.0 * d['bytes'] / total:.0f}%)"
            )
        for unit in self.units:
            if unit.reused_by:
                lines.append(
                    f"  {unit.path} is also called by {', '.join(unit.reused_by)} (tied weights): "
                    f"that call runs on its owner's device {short_device(self.devices[unit.index])}"
                )
        return lines

    def table_lines(self) -> list[str]:
        """The task log's view: one row per placed piece."""
        rows = self.rows()
        table = [
            (
                r["layer"],
                f"{r['params']:,}",
                format_bytes(r["bytes"]),
                short_device(r["device"])
                + (
                    ""
                    if r["rule"] or self.plan == AUTO or "/" in r["layer"]
                    else "  (no pattern: follows the layer before)"
                ),
            )
            for r in rows
        ]
        return [
            f"model_parallel placement, layer by layer (plan {self._plan_text()}):",
            *layer_table.format_rows(("layer", "params", "bytes", "device"), table),
        ]

    def report(
        self, *, optimizer: Any = None, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The placement as a JSON-able dict: layers, their variables' real devices, totals per device."""
        payload: dict[str, Any] = {
            "devices": self.devices,
            "plan": AUTO if self.plan == AUTO else [[r.pattern, r.index] for r in self.plan],
            "layers": self.rows(),
            "per_device": self.per_device(),
            "moved_after_build": self.moved,
            "misplaced": [list(m) for m in self.misplaced()],
            "warnings": self.warnings,
        }
        if optimizer is not None:
            payload["optimizer_variables"] = [
                {"name": getattr(v, "path", getattr(v, "name", "?")), "device": device_of(v)}
                for v in optimizer.variables
            ]
        payload.update(extra or {})
        return payload
