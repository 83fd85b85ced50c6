"""Checkpoints: save every N steps and at the end, keep K, restore at start.

One module per job, so that each can change alone (the asynchronous writer
came as two modules and one argument, `background`):

* `checkpointer`: `Checkpointer`, what a task holds: `restore()`, `save(step)`,
  `wait()` and their contract (when the files are durable).
* `writer`: writes a checkpoint, lists it, sweeps old ones (peers' throw-away
  copies, the traced write of a checkpoint that spans tasks).
* `background_writer`: the same write on a thread, after a copy of the small state
  (`snapshot`: each tensor copied on its own device), so training goes on; the tables
  are read by the write a part at a time (`table_parts`: a task holds one part besides
  its tables).
* `restore`: the newest checkpoint that reads; damaged ones set aside.
* `listing`: the ``checkpoint`` file readers follow, and the order that keeps
  a half-written checkpoint out of their sight.
* `pins`: the evaluator's pin on the checkpoint it reads.
* `failures`: a failed read or write in one sentence.
* `final_save`: `FinalSave`, what a strategy's last words may save (a stalled cluster).

The names other modules use are re-exported here.
"""

from tfdist_trainer.io.checkpoint_names import step_of
from tfdist_trainer.runtime.checkpoints.checkpointer import PEER_DIRECTORY_PREFIX, Checkpointer
from tfdist_trainer.runtime.checkpoints.failures import model_mismatch, unreadable_reason
from tfdist_trainer.runtime.checkpoints.final_save import FinalSave
from tfdist_trainer.runtime.checkpoints.listing import (
    checkpoint_files,
    found_newest_first,
    listed_newest_first,
)
from tfdist_trainer.runtime.checkpoints.pins import PIN_FILE, pin, pinned, unpin
from tfdist_trainer.runtime.checkpoints.restore import resumes

__all__ = [
    "PEER_DIRECTORY_PREFIX",
    "PIN_FILE",
    "Checkpointer",
    "FinalSave",
    "checkpoint_files",
    "found_newest_first",
    "listed_newest_first",
    "model_mismatch",
    "pin",
    "pinned",
    "resumes",
    "step_of",
    "unpin",
    "unreadable_reason",
]
