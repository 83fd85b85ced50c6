"""`train.jit_compile=True` where XLA cannot compile the step: one sentence and exit 2, end to end.

Under parameter_server a worker's step reads and updates variables on the ps tasks, which XLA
cannot compile against ('Trying to access resource ... located in device /job:ps/...'): the chief
refuses it when its runtime starts, and the launcher ends the cluster with the chief's code. A
`DynamicEmbedding` (hash tables, no XLA kernels) is refused once the model is built, before its
step is traced (raised while tracing it would reach the task as AutoGraph's StagingError, exit 1).
Fixed tables under XLA, and these sentences in process: tests/unit/test_xla_tables.py.
"""

from __future__ import annotations

import pytest
from clusterlib import (
    FAST_MNIST,
    REPO,
    assert_one_error_line,
    launch_cmd,
    run,
    strategy_gin,
    train_cmd,
)

JIT = "--gin_bindings=train.jit_compile=True"


@pytest.mark.cluster
def test_parameter_server_refuses_jit_compile_in_one_sentence(tmp_path):
    result = run(
        launch_cmd(
            ["--num_workers=1", "--num_ps=1"],
            [
                *FAST_MNIST,
                strategy_gin("parameter_server"),
                JIT,
                f"--model_dir={tmp_path / 'model'}",
            ],
        ),
        timeout=120,
    )
    assert_one_error_line(
        result,
        2,
        "[chief:0] error: train.jit_compile=True cannot run parameter_server: a worker's step "
        "reads and updates variables on the ps tasks, and TensorFlow's XLA compiles a step only "
        "against variables on its own device",
    )


def test_dynamic_tables_refuse_jit_compile_in_one_sentence(tmp_path):
    result = run(
        train_cmd(
            f"--gin_file={REPO}/configs/sharded_embedding/dynamic_tiny.gin",
            strategy_gin("one_device"),
            JIT,
            f"--model_dir={tmp_path / 'model'}",
        ),
        timeout=120,
    )
    assert_one_error_line(
        result,
        2,
        ": a DynamicEmbedding cannot run in an XLA-compiled step (train.jit_compile=True, or a "
        "jit_compile function): XLA has no kernels for its key -> row hash tables; set "
        "train.jit_compile=False, or use a ShardedEmbedding of fixed size.",
    )
