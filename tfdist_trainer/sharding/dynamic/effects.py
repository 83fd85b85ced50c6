"""Effects in order: the ops a traced function must run before the next step, or nothing eagerly.

Why: a dynamic table's shard changes several variables and hash tables per
step, and each change must happen before what reads it; in a traced function
`tf.control_dependencies` takes ops, while eagerly every update has already
run when its Python call returns.
"""

from __future__ import annotations

import tensorflow as tf


def effect_ops(effects: list) -> list:
    """What `tf.control_dependencies` takes for each effect (an update's op in a graph; nothing eagerly)."""
    if tf.executing_eagerly():
        return []
    return [e.op if hasattr(e, "op") else e for e in effects if e is not None]
