"""CPU seconds each task of a local cluster has used, read from ``/proc``: standard library only.

Used with benchmarks/socket_bytes.py by click_vs_tf_keras and its tf-keras chief: on a machine
whose cores the whole cluster shares, examples/s says how fast, and CPU per step per role says
where the work is (the chief scheduling, the workers stepping, the ps applying updates). A task is
the process listening on its address's port; the chief is the calling process.
"""

from __future__ import annotations

import os

try:
    from benchmarks.socket_bytes import listening_pids
except ImportError:  # the tf-keras chief has benchmarks/ on its path, not the repository
    from socket_bytes import listening_pids

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: str) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def cluster_cpu(cluster: dict[str, list[str]]) -> dict[str, float]:
    """{'chief': s, 'worker': s summed over workers, 'ps': s summed over ps} used so far."""
    totals = {"chief": _cpu_seconds(str(os.getpid()))}
    for role in ("worker", "ps"):
        pids = listening_pids(cluster.get(role, []))
        totals[role] = sum(_cpu_seconds(pid) for pid in pids)
    return totals


def per_step_ms(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    """CPU milliseconds per step of each role between two `cluster_cpu` readings."""
    return {role: 1000 * (after[role] - before[role]) / steps for role in before}
