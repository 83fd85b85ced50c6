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
  restores each table a slice at a time, the slices its layout saves (a shard
  each for "div"), each read on its shard's device (a ps reads its own rows
  from storage) and assigned in place. A ps's peak stays its tables plus one
  slice. Slices aligned with the saved ones matter: TF reads a whole saved slice
  for any part of it (64 MiB chunks of 290 MiB saved shards read the 1B
  model's tables 4.5 times over: 131 MiB/s against the disk's 959).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import tensorflow as tf
from absl import logging

from tfdist_trainer.sharding.fixed.checkpoint import LogicalTableCheckpoint

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
    function with the restored prefix, after that restore, to restore them a slice at a time.

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
    total = largest = 0
    for table in tables:
        vocab, dim = table.shape
        saved = shapes.get(table.checkpoint_name)
        if saved != [vocab, dim]:
            raise AssertionError(
                f"{table.checkpoint_name} is saved as {saved}; this model's table is [{vocab}, {dim}]"
            )
        # The slices this layout saves ("div": a shard each; "mod": CHECKPOINT_SLICE_BYTES): a
        # checkpoint of the same layout is read one saved slice at a time, each read once.
        for index, (_, rows, _) in enumerate(table.slices()):
            table.restore_slice(prefix, index)
            largest = max(largest, rows * dim * table.checkpoint_dtype.size)
        total += vocab * dim * table.checkpoint_dtype.size
    seconds = time.monotonic() - started
    logging.info(
        "restored %d sharded table(s), %.1f MiB, a slice at a time (at most %.1f MiB) in %.2fs "
        "(%.0f MiB/s)",
        len(tables),
        total / 2**20,
        largest / 2**20,
        seconds,
        total / 2**20 / max(seconds, 1e-9),
    )
