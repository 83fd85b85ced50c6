"""Reports: where every variable lives (`placement_records`, `placement_table`), and what a traced step
does with the sharded tables (`step_access_report`)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfdist_trainer import tf_compat
from tfdist_trainer.sharding.fixed.layer import sharded_layers
from tfdist_trainer.sharding.placement import task_of
from tfdist_trainer.tables import format_table
from tfdist_trainer.variables import device_of, format_bytes, stored_bytes


def _as_variables(model_or_variables: Any) -> list:
    if isinstance(model_or_variables, (keras.layers.Layer, keras.optimizers.Optimizer)):
        return list(model_or_variables.variables)
    return list(model_or_variables)


def placement_records(model_or_variables: Any) -> dict[str, Any]:
    """Where each variable lives: {"variables": [{name, shape, bytes, device}], "bytes_per_task": {...}}."""
    rows, per_task = [], {}
    for variable in _as_variables(model_or_variables):
        device = device_of(variable)
        size = stored_bytes(variable)
        rows.append(
            {
                "name": getattr(variable, "path", None) or variable.name,
                "shape": [int(d) if d is not None else None for d in variable.shape],
                "bytes": size,
                "device": device,
            }
        )
        per_task[task_of(device)] = per_task.get(task_of(device), 0) + size
    ps = {t: b for t, b in per_task.items() if "/job:ps/" in t}
    imbalance = (max(ps.values()) / max(1, min(ps.values())) - 1.0) if len(ps) > 1 else 0.0
    return {
        "variables": rows,
        "bytes_per_task": dict(sorted(per_task.items())),
        "ps_imbalance": imbalance,
    }


def placement_table(model_or_variables: Any) -> str:
    """A readable table: variable, shape, bytes, device; then bytes per task (and the ps imbalance)."""
    records = placement_records(model_or_variables)
    rows = [
        (
            r["name"],
            "x".join(map(str, r["shape"])) or "scalar",
            f"{r['bytes']:,}",
            r["device"] or "-",
        )
        for r in records["variables"]
    ]
    lines = format_table(
        ("variable", "shape", "bytes", "device"), rows, left=(0, 1, 3)
    ).splitlines()
    lines.append("bytes per task:")
    total = sum(records["bytes_per_task"].values()) or 1
    for task, size in records["bytes_per_task"].items():
        lines.append(f"  {task}: {size:,} ({format_bytes(size)}, {100 * size / total:.1f}%)")
    if any("/job:ps/" in t for t in records["bytes_per_task"]):
        lines.append(f"ps imbalance (largest / smallest - 1): {100 * records['ps_imbalance']:.1f}%")
    return "\n".join(lines)


def _operations(graph: tf.Graph) -> list:
    """The ops of `graph` and of the function graphs nested in it (loop bodies, conds)."""
    ops, graphs, seen = [], [graph], set()
    while graphs:
        g = graphs.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        graphs.extend(tf_compat.graph_functions(g))
        ops.extend(g.get_operations())
    return ops


def whole_reads(graph: tf.Graph, variables: list, min_bytes: int) -> list[dict[str, Any]]:
    """The variables of at least `min_bytes` that a traced step reads whole to look rows up.

    A lookup that reads only its rows is a `ResourceGather` on the variable; a
    `GatherV2` whose table input has a variable's whole shape read the variable
    first (a plain Keras `Embedding` under a distributed strategy, keras-rs'
    tables off TPU): the whole table moves, or is copied, at every step.
    """
    large = {}
    for variable in variables:
        size = stored_bytes(variable)
        if size >= min_bytes and len(variable.shape) >= 2:
            shape = tuple(int(d) for d in variable.shape)
            large.setdefault(shape, []).append((getattr(variable, "path", variable.name), size))
    found: dict[str, int] = {}
    for op in _operations(graph):
        if op.type != "GatherV2" or not op.inputs:
            continue
        shape = op.inputs[0].shape
        if shape.rank is not None and shape.is_fully_defined():
            for name, size in large.get(tuple(shape.as_list()), ()):
                found[name] = size
    return [{"name": name, "bytes": size} for name, size in sorted(found.items())]


def step_access_report(graph: tf.Graph, model: keras.layers.Layer) -> dict[str, Any]:
    """What a traced step graph does with the model's sharded tables (for tests and debugging).

    Counts the sparse accesses (ResourceGather, ResourceScatter*, ResourceSparseApply*) and the
    collective ops between synchronous replicas (each a round trip between
    workers under multi_worker_mirrored), and lists any
    op whose output has the full shape of a table or of a whole shard: a dense
    read (ReadVariableOp) or a concatenation (ConcatV2) of whole shards means
    the step moves the table, not only the rows it needs.
    """
    tables = [w for layer in sharded_layers(model) for w in layer.sharded_weights()]
    full_shapes = set()
    for table in tables:
        full_shapes.add((table.layout.vocab, table.dim))
        for i in range(table.layout.num_shards):
            full_shapes.add((table.layout.rows(i), table.dim))
    sparse, collectives, dense = {}, {}, []
    for op in _operations(graph):
        if op.type.startswith(("ResourceGather", "ResourceScatter", "ResourceSparseApply")):
            sparse[op.type] = sparse.get(op.type, 0) + 1
        elif op.type.startswith("Collective"):
            collectives[op.type] = collectives.get(op.type, 0) + 1
        for out in op.outputs:
            if out.shape.rank == 2 and tuple(out.shape.as_list()) in full_shapes:
                dense.append({"op": op.type, "name": op.name, "shape": out.shape.as_list()})
    return {
        "sparse_ops": sparse,
        "collective_ops": collectives,
        "full_table_ops": dense,
        "tables": [
            {"name": t.key, "rows": t.layout.vocab, "dim": t.dim, "shards": t.layout.num_shards}
            for t in tables
        ],
    }
