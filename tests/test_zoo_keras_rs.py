"""The model zoo's keras_rs_dlrm (configs/zoo/keras_rs_dlrm.gin: a DLRM / DCN-v2 written with keras-rs,
its tables through sharding.from_keras_rs) under the strategies of zoo.RUNS (see tests/zoo.py).

Under parameter_server with 2 ps, the point of the bridge: keras-rs' own
DistributedEmbedding puts each table whole on one ps (imbalance 207% measured);
here every table is split over both and the table bytes per ps agree within 10%.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import zoo
from servinglib import assert_each_weight_exported_once, model_weight_bytes

MODEL = "keras_rs_dlrm"
TABLES = 6  # KerasRsDlrmTrainer.vocab_sizes in configs/zoo/keras_rs_dlrm.gin
# parameter_server has its own test below, with 2 ps. Under model_parallel each table is one shard
# (num_shards None outside parameter_server) that the 'auto' plan places whole on a device.
# multi_worker_mirrored: no step reads a keras-rs table whole (a plain Keras table would be). mirrored
# at 10: wide_deep, whose tables meet it too (tests/zoo.py, RUNS).
NOT_PS = zoo.strategies(MODEL, but=["parameter_server"])
TABLE_SHARD = re.compile(r"^embedding/(table_\d+)/embeddings_shard_\d+$")


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", NOT_PS)
def test_keras_rs_dlrm_trains_under_every_other_strategy(strategy, tmp_path):
    stdout = zoo.train_and_check(MODEL, strategy, str(tmp_path / strategy), extra=[WARN_ANY_TABLE])
    assert_no_table_read_whole(stdout)


#: Every table (the smallest is 7 x 8 floats) is a "large" one for the whole-table warnings.
WARN_ANY_TABLE = "train.whole_table_warning_mib=0.0001"


def assert_no_table_read_whole(stdout: str) -> None:
    """No step reads a table whole to look rows up (GatherV2 of the table): the warning of
    tfdist_trainer/runtime/whole_tables.py, which tests/test_whole_tables.py shows for a plain
    Keras Embedding. (At this threshold the dense kernels placed whole on a ps are named too.)"""
    whole = [line for line in stdout.splitlines() if "is read whole" in line]
    assert not whole, whole


@pytest.mark.cluster
def test_keras_rs_dlrm_tables_shard_evenly_over_two_ps(tmp_path):
    """parameter_server, 2 workers and 2 ps: trains, every table is split over both ps, and the
    table bytes per ps (model_dir/variable_placement.json, the chief's record) differ by < 10%.
    Exported at the end, each weight once."""
    model_dir = tmp_path / "parameter_server"
    stdout = zoo.train_and_check(
        MODEL,
        "parameter_server",
        str(model_dir),
        cluster=("--num_workers=2", "--num_ps=2"),
        extra=[WARN_ANY_TABLE, "train.extra_hooks=[@ExportSavedModel()]"],
    )
    with open(os.path.join(model_dir, "variable_placement.json")) as f:
        records = json.load(f)["variables"]
    tasks_of: dict[str, set[str]] = {}
    bytes_per_ps: dict[str, int] = {}
    for record in records:
        match = TABLE_SHARD.match(record["name"])
        if not match:
            continue
        task = re.search(r"/job:ps/replica:0/task:\d+", record["device"]).group(0)
        tasks_of.setdefault(match.group(1), set()).add(task)
        bytes_per_ps[task] = bytes_per_ps.get(task, 0) + record["bytes"]
    assert len(tasks_of) == TABLES, records
    whole = {table: tasks for table, tasks in tasks_of.items() if len(tasks) < 2}
    assert not whole, f"tables whole on one ps: {whole}"
    assert len(bytes_per_ps) == 2, bytes_per_ps
    assert max(bytes_per_ps.values()) <= 1.10 * min(bytes_per_ps.values()), bytes_per_ps
    print(f"table bytes per ps: {bytes_per_ps}")
    assert_no_table_read_whole(stdout)
    # The checkpoint holds every table (Keras 3 alone saves no sublayer kept in a list).
    import tensorflow as tf

    checkpoint = tf.train.latest_checkpoint(model_dir)
    saved = [name for name, _ in tf.train.list_variables(checkpoint)]
    for table in tasks_of:
        assert any(name.startswith("model/") and f"/{table}/" in name for name in saved), saved
    assert_each_weight_exported_once(
        str(model_dir / "export" / str(zoo.TRAIN_STEPS)), model_weight_bytes(checkpoint)
    )
