"""The evaluator's pin: the checkpoint it is reading, which the chief must not delete.

The evaluator side-car pins the checkpoint it is reading (`pin`): a small
file under model_dir naming it, which the chief reads before each sweep and
spares from ``train.keep_checkpoints``. Without it a chief that saves faster
than a large model restores could delete every checkpoint before the
evaluator has read one. A file, not a lock or a clock: it works the same on
a shared disk and on an object store, across hosts. The chief reads the pin
after writing a checkpoint, right before it deletes old ones. The one race
left (the chief reads the pin just before the evaluator writes it, then
deletes that checkpoint) is the evaluator's to handle: its restore fails, or
the checkpoint is gone once restored, and it takes the newest checkpoint,
which is pinned before the chief sweeps again.
"""

from __future__ import annotations

import json

from tfdist_trainer.io import storage
from tfdist_trainer.runtime.checkpoints.listing import basename

#: Where the evaluator names the checkpoint it is reading, relative to model_dir.
PIN_FILE = storage.join("eval", "pinned_checkpoint.json")


def pin(model_dir: str, prefix: str, *, by: str) -> None:
    """Asks the chief to keep checkpoint `prefix` until another is pinned or `unpin` is called."""
    path = storage.join(model_dir, PIN_FILE)
    storage.makedirs(storage.dirname(path))
    storage.write_text(
        path,
        json.dumps({"checkpoint": basename(prefix), "by": by}) + "\n",
    )


def unpin(model_dir: str) -> None:
    storage.remove(storage.join(model_dir, PIN_FILE))


def pinned(model_dir: str) -> str | None:
    """The basename (``ckpt-200``) of the pinned checkpoint, or None."""
    record = storage.read_json(storage.join(model_dir, PIN_FILE))
    name = record.get("checkpoint") if isinstance(record, dict) else None
    return name if isinstance(name, str) else None
