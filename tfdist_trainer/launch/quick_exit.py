"""Leaving a finished process without tearing its interpreter down.

Once a TensorFlow process has done its work, Python's teardown (every module's
objects, TF's runtime and thread pools) takes 0.8 s or more, and under a running
TF server it sometimes crashed (exit 139 after the line saying 143). Nothing is
left to do in it by then but run the exit functions and flush the output.
"""

from __future__ import annotations

import atexit
import os
import sys

from absl import logging


def leave(code: int) -> None:
    """Runs the exit functions (a user's `atexit` hook, AutoGraph's temporary files), flushes the
    log and the streams, and exits with `code` at once."""
    atexit._run_exitfuncs()
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
