"""tfdist_trainer.launch.console and failure_cause, in process: the console's short format for task
lines (`short_line`) and the traceback a failing task's output is held back by (`TracebackHold`)."""

from __future__ import annotations

import time

from tfdist_trainer.launch.console import short_line
from tfdist_trainer.launch.failure_cause import TracebackHold
from tfdist_trainer.launch.supervisor import finished_tasks, started_tasks

INFO = "[chief:0] I1125 10:06:13.424594 139980406279040 controller.py:139] step 10/50 loss=1.2"
WARNING = "[worker:1] W1125 10:06:14.000001 139980406279040 data.py:12] slow input"
CPP_ERROR = "[ps:0] E0000 00:00:1795608283.361604   30166 context.cc:911] Failed to remove function"


def test_short_line_keeps_the_time_and_a_level_only_for_warnings_and_errors():
    assert short_line(INFO) == "[chief:0] 10:06:13 step 10/50 loss=1.2"
    assert short_line(WARNING) == "[worker:1] 10:06:14 W slow input"
    clock = time.strftime("%H:%M:%S", time.localtime(1795608283.361604))
    assert short_line(CPP_ERROR) == f"[ps:0] {clock} E Failed to remove function"
    # a header without a role prefix, as a lone process prints it
    assert short_line(INFO.split("] ", 1)[1]) == "10:06:13 step 10/50 loss=1.2"


def test_short_line_leaves_other_lines_alone():
    for line in (
        "[launch] job succeeded",
        "[chief:0] sequential/dense/kernel  1600x128  819,200  /job:ps/replica:0/task:0",
        "[worker:0] Traceback (most recent call last):",
        "[worker:0] ",
        "",
    ):
        assert short_line(line) == line


TRACEBACK = [
    "[worker:0] Traceback (most recent call last):",
    '[worker:0]   File "/x/cli.py", line 10, in <module>',
    "[worker:0]     run()",
    "[worker:0]     ^^^^^",
    "[worker:0] tensorflow.python.framework.errors_impl.InvalidArgumentError: bad shape [3] vs [4]",
]


def _feed(hold: TracebackHold, lines: list[str]) -> list[str]:
    return [out for line in lines for out in hold.feed(line)]


def test_a_traceback_is_held_until_the_task_goes_on():
    hold = TracebackHold()
    assert _feed(hold, [INFO]) == [INFO]
    assert _feed(hold, TRACEBACK) == []
    assert hold.cause() == "InvalidArgumentError: bad shape [3] vs [4]"
    # a warning after it still belongs to the failure; an INFO record means the task went on
    assert _feed(hold, [WARNING]) == []
    assert _feed(hold, [INFO]) == [*TRACEBACK, WARNING, INFO]
    assert hold.held == [] and hold.cause() is None


def test_the_cause_of_a_chain_is_its_last_exception():
    chained = [
        "[chief:0] Traceback (most recent call last):",
        '[chief:0]   File "a.py", line 1, in f',
        "[chief:0] KeyError: 'x'",
        "[chief:0] ",
        "[chief:0] During handling of the above exception, another exception occurred:",
        "[chief:0] ",
        "[chief:0] Traceback (most recent call last):",
        '[chief:0]   File "b.py", line 2, in g',
        "[chief:0] RuntimeError: boom",
    ]
    hold = TracebackHold()
    _feed(hold, chained)
    assert hold.cause() == "RuntimeError: boom"
    assert hold.release() == chained


def test_the_cause_of_a_tf_function_error_is_the_error_it_wraps():
    wrapped = [
        "[chief:0] Traceback (most recent call last):",
        '[chief:0]   File "body.py", line 108, in train_loop',
        "[chief:0] TypeError: in user code:",
        "[chief:0] ",
        '[chief:0]     File "trainer.py", line 114, in train_step  *',
        "[chief:0]         self.apply_gradients(gradients)",
        "[chief:0] ",
        "[chief:0]     TypeError: f() takes 2 positional arguments but 3 were given",
        "[chief:0] ",
    ]
    hold = TracebackHold()
    _feed(hold, wrapped)
    assert hold.cause() == "TypeError: f() takes 2 positional arguments but 3 were given"


def test_a_long_cause_is_cut_and_an_unfinished_traceback_has_none():
    hold = TracebackHold()
    _feed(hold, TRACEBACK[:-1])
    assert hold.cause() is None  # the task died before printing its exception
    _feed(hold, ["[worker:0] ValueError: " + "x" * 500])
    cause = hold.cause()
    assert cause.startswith("ValueError: xxx") and len(cause) == 300 and cause.endswith("...")


def test_the_coordinators_copies_of_an_error_the_task_names_in_one_sentence_are_left_out():
    copy = [
        "[chief:0] E1126 07:34:25.1 1 cluster_coordinator.py:990] /job:worker/task:1 encountered "
        "the following error when processing closure: InvalidArgumentError():Graph execution error:",
        "[chief:0] ",
        '[chief:0]   File "dynamic_table.py", line 233, in _step',
        "[chief:0] assertion failed: [table_5 shard 0: its 4 rows cannot hold ...]",
    ]
    error = "[chief:0] error: table_5 shard 0: its 4 rows cannot hold the distinct keys; raise capacity."
    hold = TracebackHold()
    assert _feed(hold, [*copy, error]) == []
    assert hold.traceback() == [error] and hold.named_its_error()
    # Without the task's own line, the copies are all there is to show.
    hold = TracebackHold()
    _feed(hold, copy)
    assert hold.traceback() == copy and not hold.named_its_error()


def test_the_launchers_start_lines_name_every_tasks_pid_and_address():
    """One line for all tasks at the start, one per restarted task: tools find each pid."""
    output = "\n".join(
        [
            "[launch] parameter_server: chief:0, worker:0, worker:10, ps:0",
            "[launch] started chief:0 (pid 11, 127.0.0.1:5000), worker:0 (pid 12, 127.0.0.1:5001), "
            "worker:10 (pid 13, 127.0.0.1:5002), ps:0 (pid 14, 127.0.0.1:5003); logs: /tmp/m/logs",
            "[launch] worker:0 exited with code 137; restarting worker:0 in 1s",
            "[launch] started worker:0 (pid 21, 127.0.0.1:5001); log: /tmp/m/logs/worker-0.log",
            "[launch] started evaluator:0 (pid 22); log: /tmp/m/logs/evaluator-0.log",
        ]
    )
    assert started_tasks(output) == [
        ("chief:0", "11", "127.0.0.1:5000"),
        ("worker:0", "12", "127.0.0.1:5001"),
        ("worker:10", "13", "127.0.0.1:5002"),
        ("ps:0", "14", "127.0.0.1:5003"),
        ("worker:0", "21", "127.0.0.1:5001"),
        ("evaluator:0", "22", ""),
    ]


def test_tasks_that_exit_together_are_one_finished_line_that_tools_still_read_per_task():
    """A 100-task job ends with a line, not a hundred; the chaos benchmark still tells worker:1
    from worker:10."""
    import re

    from benchmarks import chaos

    output = "\n".join(
        [
            "[launch] finished: chief:0",
            "[launch] finished: ps:0, worker:10, ps:1",
            "[launch] job succeeded",
        ]
    )
    assert finished_tasks(output) == ["chief:0", "ps:0", "worker:10", "ps:1"]
    assert re.compile(chaos.GONE.format(role="worker:10"), re.M).search(output)
    assert re.compile(chaos.GONE.format(role="ps:1"), re.M).search(output)
    assert not re.compile(chaos.GONE.format(role="worker:1"), re.M).search(output)
