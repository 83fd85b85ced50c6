"""tfdist-launch's restart budget (launch/restart_budget.py), in process with a fake clock.

Spaced faults never add up; a crash loop spends the budget and is called one, deliberate kills
close together spend it and are called what they were;
a task's delay doubles with its own restarts and starts over once it ran healthily.
The launcher's use of it with real processes: tests/test_launch_faults.py.
"""

from __future__ import annotations

import pytest

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.launch.restart_budget import HEALTHY_AFTER_S, MAX_DELAY_S, RestartBudget


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_spaced_faults_never_add_up():
    clock = Clock()
    budget = RestartBudget(3, 300.0, 1.0, clock=clock)
    for _ in range(20):  # a fault every 4 minutes for 80 minutes, each after a healthy run
        clock.now += 240.0
        assert not budget.exhausted()
        assert budget.take("worker:0", ran_for_s=240.0) == 1.0  # healthy: the first delay again
    assert budget.recent() == 2  # the last two, 240 s apart, are within one window


def test_a_crash_loop_spends_the_budget_and_says_so():
    clock = Clock()
    budget = RestartBudget(3, 300.0, 1.0, clock=clock)
    delays = []
    while not budget.exhausted():
        clock.now += 5.0
        delays.append(budget.take("chief:0", ran_for_s=5.0))
    assert delays == [1.0, 2.0, 4.0]
    why = budget.why_exhausted("chief:0", ran_for_s=5.0, code=1)
    assert why.startswith(
        "chief:0 is in a crash loop: it exited with code 1 on its own 5s after its start, "
        "after 3 restarts within 300s"
    ), why
    assert "--backoff_limit=3 per --backoff_window_s" in why
    # Many faults close together, each after a healthy run: the limit, not a crash loop.
    assert budget.why_exhausted("worker:1", ran_for_s=HEALTHY_AFTER_S, code=1) == (
        "the restart budget is spent: 3 restarts within 300s (--backoff_limit=3 per "
        "--backoff_window_s); the last, worker:1, exited with code 1 on its own 120s after its start"
    )
    # Deliberate kills close together (a fault schedule): the budget, never a crash loop.
    for code, signal_name in ((137, "SIGKILL"), (-9, "SIGKILL"), (143, "SIGTERM")):
        why = budget.why_exhausted("ps:0", ran_for_s=75.0, code=code)
        assert "crash loop" not in why, why
        assert why.startswith("the restart budget is spent: 3 restarts within 300s"), why
        assert why.endswith(f"the last, ps:0, was killed ({signal_name}) 75s after its start"), why
    clock.now += 301.0  # the window moves on
    assert not budget.exhausted()


def test_each_task_backs_off_on_its_own_up_to_the_cap():
    budget = RestartBudget(100, 1e9, 1.0, clock=Clock())
    assert [budget.take("ps:0", ran_for_s=1.0) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert budget.take("worker:0", ran_for_s=1.0) == 1.0
    assert max(budget.take("ps:0", ran_for_s=1.0) for _ in range(20)) == MAX_DELAY_S


@pytest.mark.parametrize("window", [0, -5.0, "soon", True])
def test_a_window_that_is_not_a_positive_number_is_one_error(window):
    with pytest.raises(
        ConfigError, match=r"--backoff_window_s must be a positive number of seconds"
    ):
        RestartBudget(3, window, 1.0)
