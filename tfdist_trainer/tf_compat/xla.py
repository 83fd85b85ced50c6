"""Private TF control-flow API: whether the graph being traced is compiled by XLA.

A lookup has two forms: the fast one (each shard reads its own distinct ids,
`tf.unique` / `tf.dynamic_partition` / `tf.dynamic_stitch`) has shapes known only at
run time, which XLA cannot compile; the static one (every shard reads every id,
masked) compiles. Only the lookup knows which to trace, and only while tracing.
"""

from __future__ import annotations


def in_xla_compile() -> bool:
    """Whether the function being traced, or one it is traced inside, is compiled by XLA
    (`tf.function(jit_compile=True)`, Keras' `jit_compile`).

    `tf.function(jit_compile=True)` enters an `XLAControlFlowContext` in the graph it
    traces; TF itself asks `control_flow_util.GraphOrParentsInXlaContext` (cond_v2,
    MirroredStrategy's merge_call), and has no public way to ask. Eagerly: False.
    """
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))
