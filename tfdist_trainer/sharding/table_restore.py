"""A restart reads its tables, and nothing else: no initialisation first, no second copy.

Two costs of a plain restore that grow with the tables (measured on 1b.gin, 4 GB
of tables on 2 ps): every table is first initialised, its rows drawn at random
(31 s on 2 cores) only to be overwritten; and TensorFlow's restore reads all of a
device's tensors with one RestoreV2 before it assigns any, so a ps briefly holds
its tables twice (4.5 GB peak for 2.6 GB steady).

* `restore_follows()`: sharded tables created inside it start as zeros (a
  memory fill), because a restore overwrites every row next; the training task
  enters it when its model_dir has a checkpoint to resume from (a restore then
  either succeeds or ends the task, so the zeros are never trained on).
* `restored_apart(checkpoint)`: inside it, a restore of `checkpoint` reads one
  row of each sharded table (learning its key); the function it yields then
  restores each table in chunks of `CHUNK_BYTES` of logical rows, each shard's
  rows read on that shard's device (a ps reads its own rows from storage) and
  assigned in place. A ps's peak stays its tables plus one chunk.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import tensorflow as tf
from absl import logging

from tfdist_trainer.sharding.checkpoint import LogicalTableCheckpoint

#: Logical rows of a table read and assigned at once (per chunk: at most this many bytes).
CHUNK_BYTES = 64 << 20

_restore_follows = [False]


@contextlib.contextmanager
def restore_follows(follows: bool = True) -> Iterator[None]:
    """Sharded tables created inside start as zeros when `follows`: a restore overwrites them next."""
    _restore_follows.append(follows)
    try:
        yield
    finally:
        _restore_follows.pop()


def tables_start_as_zeros() -> bool:
    """True inside `restore_follows` (`ShardedWeight` asks it)."""
    return _restore_follows[-1]


@contextlib.contextmanager
def restored_apart(checkpoint: tf.train.Checkpoint) -> Iterator[Callable[[str], None]]:
    """Inside, a restore of `checkpoint` leaves its sharded tables alone; call the yielded
    function with the restored prefix, after that restore, to restore them in chunks.

    A table the checkpoint holds under another shape raises AssertionError, as a model
    mismatch does in TF's own restore.
    """
    tables = [
        t
        for t in tf.train.TrackableView(checkpoint).descendants()
        if isinstance(t, LogicalTableCheckpoint)
    ]
    for table in tables:
        table.restored_apart = True
    try:
        yield lambda prefix: _restore_in_chunks(tables, prefix)
    finally:
        for table in tables:
            table.restored_apart = False


def _restore_in_chunks(tables: list[LogicalTableCheckpoint], prefix: str) -> None:
    if not tables:
        return
    started = time.monotonic()
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    total = 0
    for table in tables:
        vocab, dim = table.shape
        saved = shapes.get(table.checkpoint_name)
        if saved != [vocab, dim]:
            raise AssertionError(
                f"{table.checkpoint_name} is saved as {saved}; this model's table is [{vocab}, {dim}]"
            )
        rows = max(1, CHUNK_BYTES // (dim * table.checkpoint_dtype.size))
        for first in range(0, vocab, rows):
            table.restore_rows(prefix, first, min(rows, vocab - first))
        total += vocab * dim * table.checkpoint_dtype.size
    seconds = time.monotonic() - started
    logging.info(
        "restored %d sharded table(s), %.1f MiB, in chunks of at most %.0f MiB in %.2fs (%.0f MiB/s)",
        len(tables),
        total / 2**20,
        CHUNK_BYTES / 2**20,
        seconds,
        total / 2**20 / max(seconds, 1e-9),
    )
