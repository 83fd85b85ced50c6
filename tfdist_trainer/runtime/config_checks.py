"""Configuration checks that can only run on data: a failed one is a ConfigError (exit 2), not a crash.

Why: some settings can only be judged against a batch, inside the traced
step (a dynamic table's `capacity` against the distinct keys one batch brings
to a shard). TensorFlow reports a failed in-graph assertion as an
InvalidArgumentError with the graph's traceback; for a setting the user must
change, the task should instead say the assertion's sentence and exit 2, as
for any other bad configuration. Such assertions are named `CONFIG_CHECK`
(the name appears in the failing node's name, on whichever task ran it).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import tensorflow as tf

from tfdist_trainer.errors import CONFIG_CHECK, ConfigError

#: The line of a failed assertion: its data, each part in brackets ("[a] [35] [b]").
_ASSERTION = re.compile(r"assertion failed: (?P<parts>(?:\[[^\]\n]*\] ?)+)")
_PART = re.compile(r"\[([^\]\n]*)\]")


@contextlib.contextmanager
def config_checks_are_config_errors() -> Iterator[None]:
    """Re-raises a failed `CONFIG_CHECK` assertion as a ConfigError of its own message."""
    try:
        yield
    except tf.errors.InvalidArgumentError as e:
        text = getattr(e, "message", None) or str(e)
        found = _ASSERTION.search(text)
        if CONFIG_CHECK not in text or not found:
            raise
        message = "".join(_PART.findall(found.group("parts")))
        raise ConfigError(f"{message.rstrip('.')}.") from None
