"""How many restarts a local job may take, and how long to wait before each one.

A budget over a window, not over the job's life: ``--backoff_limit`` restarts
within any ``--backoff_window_s``. A job that runs for a week and loses a pod a
day never runs out; a crash loop (a task dying seconds after each start) spends
the budget within minutes and stops the job with a line that says so. Each
task's delay doubles with its own restarts, up to MAX_DELAY_S, and goes back to
``--restart_backoff_s`` once it has run healthily for HEALTHY_AFTER_S
(Kubernetes resets CrashLoopBackOff after 10 minutes of running).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from tfdist_trainer import checks

#: Exit codes of a task ended by a signal (a shell's 128 + signal, or Popen's -signal): not its own doing.
_KILLED_BY = {
    137: "SIGKILL",
    -9: "SIGKILL",
    143: "SIGTERM",
    -15: "SIGTERM",
    130: "SIGINT",
    -2: "SIGINT",
}


def how_it_ended(code: int | None) -> str | None:
    """'was killed (SIGKILL)' for a task a signal ended; None for one that exited on its own."""
    signal_name = _KILLED_BY.get(code) if code is not None else None
    return f"was killed ({signal_name})" if signal_name else None


#: A task that ran this long before it failed starts over at the first delay.
HEALTHY_AFTER_S = 120.0
#: The longest wait before a restart (Kubernetes caps CrashLoopBackOff at 5 minutes).
MAX_DELAY_S = 300.0


class RestartBudget:
    """`limit` restarts within any `window_s`; per-task delays from `base_delay_s`."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        base_delay_s: float,
        *,
        healthy_after_s: float = HEALTHY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        checks.positive_number("--backoff_window_s", window_s, unit="seconds")
        self.limit = limit
        self.window_s = float(window_s)
        self.base_delay_s = base_delay_s
        self.healthy_after_s = healthy_after_s
        self._clock = clock
        self._restarts: collections.deque[float] = collections.deque()
        self._streak: dict[str, int] = {}  # restarts of a task since it last ran healthily

    def recent(self) -> int:
        """Restarts within the last window."""
        now = self._clock()
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        return len(self._restarts)

    def exhausted(self) -> bool:
        return self.recent() >= self.limit

    def crash_loop(self, ran_for_s: float, code: int | None = None) -> bool:
        """Whether a task that ended with `code` after `ran_for_s` is looping: it died on its own
        (not killed by a signal) before it ever ran healthily."""
        return ran_for_s < self.healthy_after_s and how_it_ended(code) is None

    def why_exhausted(self, role: str, ran_for_s: float, code: int | None = None) -> str:
        """What spent the budget, in one clause: which task, how many restarts in which window,
        and whether the last one was killed or ended on its own (a crash loop only then)."""
        used = (
            f"{self.recent()} restarts within {self.window_s:g}s (--backoff_limit={self.limit} "
            f"per --backoff_window_s)"
        )
        ended = how_it_ended(code) or (
            "died" if code is None else f"exited with code {code} on its own"
        )
        if self.crash_loop(ran_for_s, code):
            return f"{role} is in a crash loop: it {ended} {ran_for_s:.0f}s after its start, after {used}"
        return f"the restart budget is spent: {used}; the last, {role}, {ended} {ran_for_s:.0f}s after its start"

    def take(self, role: str, ran_for_s: float) -> float:
        """Spends one restart for `role`, which failed after running `ran_for_s`; returns its delay."""
        if ran_for_s >= self.healthy_after_s:
            self._streak[role] = 0
        streak = self._streak.get(role, 0)
        self._streak[role] = streak + 1
        self._restarts.append(self._clock())
        return min(MAX_DELAY_S, self.base_delay_s * 2**streak)
