"""Bytes a task's TCP connections carried, read from the kernel (``ss -tinp``): standard library only.

Used by benchmarks/click_vs_tf_keras.py and its tf-keras chief (which imports nothing of this
project's but this file) to measure what training sends to the parameter servers and what they
send back. The ps process is the one listening on the ps's port; every established connection of
that process counts, in both roles: TensorFlow's gRPC pulls tensors (a task asks, the owner
answers), so a gradient reaches a ps as the answer on a connection the ps opened to the worker,
and a looked-up row leaves it as the answer on a connection the worker opened. Counters start with
the connection and gRPC keeps its connections for the whole run, so the difference between two
readings is the traffic between them. Reading other processes' sockets needs their user (or root).
"""

from __future__ import annotations

import re
import subprocess

_FIELD = re.compile(r"\b(bytes_received|bytes_sent):(\d+)")
_PID = re.compile(r"\bpid=(\d+)")


def _ss(*args: str) -> str:
    return subprocess.run(["ss", *args], capture_output=True, text=True, check=True).stdout


def listening_pids(addresses: list[str]) -> set[str]:
    """The processes listening on the ports of `addresses` ('host:port')."""
    pids = set()
    for address in addresses:
        port = address.rsplit(":", 1)[1]
        pids.update(_PID.findall(_ss("-tlnpH", f"( sport = :{port} )")))
    return pids


def ps_traffic(ps_addresses: list[str]) -> dict[str, int]:
    """{'to_ps': bytes the ps processes received, 'from_ps': bytes they sent} so far, over their
    open connections."""
    pids = listening_pids(ps_addresses)
    totals = {"to_ps": 0, "from_ps": 0}
    owner = None
    for line in _ss("-tinpH", "state", "established").splitlines():
        if not line[:1].isspace():  # a socket's line; its counters follow on an indented line
            found = _PID.findall(line)
            owner = found[0] if found else None
            continue
        if owner in pids:
            for name, value in _FIELD.findall(line):
                totals["to_ps" if name == "bytes_received" else "from_ps"] += int(value)
    return totals


def per_step(before: dict[str, int], after: dict[str, int], steps: int) -> dict[str, float]:
    """Bytes per step in each direction between two `ps_traffic` readings."""
    return {key: (after[key] - before[key]) / steps for key in before}
