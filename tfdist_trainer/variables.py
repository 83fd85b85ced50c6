"""Where a variable lives and how many bytes it stores, and the JSON reports that say so.

Shared by the self-sharding layers (sharding/placement.py: bytes-balanced ps
placement; sharding/reports.py: `placement_table`) and model-parallel
placement (runtime/strategies/model_parallel/placement.py). The bytes are those of the *stored*
variable: a Keras 3 variable under a mixed-precision policy stores float32,
while its `dtype` (and `value`) read float16 inside a layer call.

TensorFlow is imported inside the functions: importing this module starts
nothing (model-parallel plans are checked before TF starts).
"""

from __future__ import annotations

import json
from typing import Any

from tfdist_trainer import tf_compat
from tfdist_trainer.io import storage


def stored_bytes(variable: Any) -> int:
    """Bytes of the variable's storage: elements times the size of the dtype it is stored in."""
    import numpy as np
    import tensorflow as tf

    shape = [int(d) if d is not None else 0 for d in variable.shape]
    stored = tf_compat.variable_storage(variable)
    dtype = getattr(stored, "dtype", None) or tf_compat.stored_dtype(variable) or variable.dtype
    return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(dtype).size


def device_of(variable: Any) -> str:
    """The device of the variable's storage ("" before it exists); "mirrored:<d1>,<d2>" for copies on several."""
    value = tf_compat.variable_storage(variable)
    if value is None:
        return ""
    devices = sorted({v.device for v in tf_compat.distributed_components(value)})
    if len(devices) > 1:
        return "mirrored:" + ",".join(devices)
    try:
        return value.device
    except (AttributeError, ValueError):
        return ""


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (B, KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} GiB"


def write_report(path: str, payload: Any) -> None:
    """Writes `payload` as indented JSON, atomically, creating the directory (a local path or any URI
    tf.io.gfile writes, e.g. under model_dir)."""
    directory = storage.dirname(path)
    if directory:
        storage.makedirs(directory)
    storage.write_text(path, json.dumps(payload, indent=2) + "\n")
