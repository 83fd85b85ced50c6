"""Ports for a local cluster that no outgoing connection can take before the task binds them.

A task binds its port seconds after the launcher picked it (TensorFlow's import
comes first). A port from the kernel's ephemeral range (`bind(0)`, what
`portpicker.pick_unused_port` returns) can be handed in that window to any
outgoing connection on the machine: a peer's gRPC channel, another job's probe,
or a probe of this very port that connects to itself (TCP simultaneous open).
The task then fails with "port ... is already in use". The kernel never gives an
outgoing connection a port below its ephemeral range, so the ports are drawn
there, at random, and kept only if they are free now.
"""

from __future__ import annotations

import itertools
import random

_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10_000  # below: well-known services and other tools' fixed ports
_TRIES = 1_000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections (Linux' default where unknown)."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999


def pick_port(taken: set[int] = frozenset(), *, span: int = 1) -> int:
    """A free port p (and p+1 .. p+span-1 free too) outside the ephemeral range, not in `taken`."""
    import portpicker

    low, high = _ephemeral_range()
    ranges = [(_LOWEST, low - span)] if low - span > _LOWEST else []
    if high + 1 <= 65_535 - span:
        ranges.append((high + 1, 65_535 - span))
    for attempt in itertools.count():
        if ranges and attempt < _TRIES:
            port = random.randint(*random.choice(ranges))
        else:  # every port outside the range is taken: the kernel's choice is the best left
            port = portpicker.pick_unused_port()
        ports = range(port, port + span)
        if ports[-1] <= 65_535 and all(
            p not in taken and portpicker.is_port_free(p) for p in ports
        ):
            return port
