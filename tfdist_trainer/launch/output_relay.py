"""What a local job's tasks print: every line to the task's log, the lines worth it to the console.

The launcher's half of the console: each task's output is pumped line by line into its log
file (kept open across restarts, on any storage `tf.io.gfile` knows) and through the
task's `console.ConsoleFilter`; a traceback is held back (`failure_cause.TracebackHold`)
until the task's fate is known, so that a job whose workers fail alike prints one
traceback and one line for each other failure.
"""

from __future__ import annotations

import subprocess
import threading

from tfdist_trainer.io import storage
from tfdist_trainer.launch import console
from tfdist_trainer.launch.failure_cause import TracebackHold
from tfdist_trainer.launch.local_tasks import LocalTask
from tfdist_trainer.launch.say import say

#: Longest a traceback is held back from the console while its task still runs.
HOLD_S = 30.0


class _Output:
    """One task process's console output: the traceback held back from it, and whether it is read."""

    def __init__(self) -> None:
        self.hold = TracebackHold()
        self.done = threading.Event()  # the process's output has been read to its end
        self.reported = False


class OutputRelay:
    """The output half of `supervisor.LocalCluster` (a mixin): task logs, the console, failure reports.

    Reads the job's `tasks`, `log_dir` and `_trained` (set once a driving task exited 0:
    later gRPC errors are shutdown chatter); `console_chatter` and `console_format` are
    the launcher's flags.
    """

    tasks: list[LocalTask]
    log_dir: str
    _trained: threading.Event

    def _init_output(self) -> None:
        """The relay's state: one log per task, one console output and filter per process."""
        self._logs: dict[str, storage.LogCopy] = {}  # one per task, kept open across its restarts
        self._print_lock = threading.Lock()
        self.console_chatter = False  # True: every line of every task on the console, too
        self.console_format = "short"  # "absl": task lines keep absl's whole header on the console
        self._outputs: dict[tuple[str, int], _Output] = {}  # (role, pid) -> its console output
        # (role, its console filter), one per process: what they hid of failed steps, counted at the end
        self._filters: list[tuple[str, console.ConsoleFilter]] = []
        self._failure_shown = False  # the job's first failure printed its traceback
        self._failed_roles: set[str] = set()  # tasks whose failure was reported
        # a task's one-sentence error -> the roles that said it: shown once, the others counted
        self._error_roles: dict[str, list[str]] = {}

    def _open_log(self, task: LocalTask) -> None:
        """Names the task's log file and opens it once: a restarted task appends to the same copy."""
        task.log_path = storage.join(self.log_dir, f"{task.task_type}-{task.index}.log")
        if task.role not in self._logs:
            self._logs[task.role] = storage.LogCopy(task.log_path)

    def _close_logs(self) -> None:
        """Closes every task's log (on an object store, its final upload); a failure is one line."""
        for log in self._logs.values():
            try:
                log.close()  # on an object store, the final upload
            except Exception as e:  # noqa: BLE001
                say(f"cannot write {log.path} ({type(e).__name__}: {str(e).strip()[:200]})")

    def _pump(self, task: LocalTask, process: subprocess.Popen) -> None:
        """Copies the task's output to its log, and the lines the console filter keeps to the
        console (in `console_format`). A traceback is held back until the task's fate is known:
        the failure report (`_report_failure`) prints it once for the whole job."""
        # A lone process calls itself 'local'; a cluster task already prints its own role.
        own_prefixes = (f"[{task.role}]", "[local]")
        log = self._logs[task.role]
        shown = console.ConsoleFilter(job_finished=self._trained.is_set, serving_routine=False)
        self._filters.append((task.role, shown))
        output = self._output_of(task.role, process)
        try:
            for raw in iter(process.stdout.readline, b""):
                if log is not None:
                    try:
                        log.write(raw)
                    except Exception as e:  # noqa: BLE001  (the task's output must keep flowing: never block its pipe)
                        say(
                            f"cannot write {task.log_path} ({type(e).__name__}: {str(e).strip()[:200]}); "
                            f"{task.role}'s output goes on here only"
                        )
                        log = None
                line = raw.decode(errors="replace").rstrip("\n")
                if not line.startswith(own_prefixes):
                    line = f"[{task.role}] {line}"
                # known TF chatter: the log file only
                if not shown(console.strip_role(line)) and not self.console_chatter:
                    continue
                if self._said_before(task.role, line):
                    continue
                with self._print_lock:
                    held_before = bool(output.hold.held)
                    self._write(output.hold.feed(line))
                    if output.hold.held and not held_before:  # a traceback starts
                        timer = threading.Timer(HOLD_S, self._release_if_running, (output, process))
                        timer.daemon = True
                        timer.start()
            if process.wait() == 0:  # a traceback the task survived: as it came
                self._print(output.hold.release())
        finally:
            output.done.set()

    def _said_before(self, role: str, line: str) -> bool:
        """Whether `line` is a task's one-sentence error (`[role] error: ...`) that another task
        said already: every worker refusing the same setting says it once on the console."""
        sentence = console.error_sentence(line)
        if sentence is None:
            return False
        with self._print_lock:
            roles = self._error_roles.setdefault(sentence, [])
            roles.append(role)
            return len(roles) > 1

    def report_same_errors(self) -> None:
        """One line naming the tasks whose error the console did not repeat (`_said_before`)."""
        for roles in self._error_roles.values():
            if len(roles) > 1:
                say(f"{', '.join(roles[1:])} ended with the same error as {roles[0]}")

    def _release_if_running(self, output: _Output, process: subprocess.Popen) -> None:
        """A traceback held for HOLD_S while its task runs on (a thread's, or a hang): print it."""
        with self._print_lock:
            if process.poll() is None and not output.done.is_set():
                self._write(output.hold.release())

    def _output_of(self, role: str, process: subprocess.Popen) -> _Output:
        with self._print_lock:
            return self._outputs.setdefault((role, process.pid), _Output())

    def _print(self, lines: list[str]) -> None:
        if lines:
            with self._print_lock:
                self._write(lines)

    def _write(self, lines: list[str]) -> None:
        """Prints task lines as the console shows them; the caller holds `_print_lock`."""
        if not lines:
            return
        if self.console_format == "short":
            lines = [console.short_line(line) for line in lines]
        print("\n".join(lines), flush=True)

    def _report_failure(self, task: LocalTask) -> None:
        """A task that died of a traceback: for the job's first such failure one line with its
        cause and then the traceback (once: not the coordinator's log records of the same error),
        for any later one (another worker failing alike, a restarted task failing again) one
        line; every traceback is in the task's log."""
        output = self._output_of(task.role, task.process)
        output.done.wait(timeout=5)  # its pump has read the last lines the task wrote
        with self._print_lock:
            if output.reported or not output.hold.held:
                return
            output.reported = True
            if output.hold.named_its_error():  # its own sentence says it all
                self._write(output.hold.traceback())
                output.hold.release()
                return
            cause = output.hold.cause() or "a Python traceback"
            held = output.hold.traceback()
            output.hold.release()
            if self._failure_shown:
                again = "again" if task.role in self._failed_roles else "too"
                self._failed_roles.add(task.role)
                say(f"{task.role} failed {again}: {cause} (traceback: {task.log_path})")
                return
            self._failure_shown = True
            self._failed_roles.add(task.role)
            say(f"{task.role} failed: {cause} (traceback: {task.log_path})")
            self._write(held)

    def report_late_failures(self) -> None:
        """After the cluster is torn down: one line for each task that died of a traceback since the
        job's end was decided (the failure that decided it has been reported already); one for
        the tasks whose error repeated another's (`report_same_errors`); then one line counting
        the follow-on lines the console did not show (`report_follow_on`)."""
        for task in self.tasks:
            if task.process is not None and task.process.poll() not in (None, 0):
                self._report_failure(task)
        self.report_same_errors()
        self.report_follow_on()

    def report_follow_on(self) -> None:
        """One line for what the console filters hid of a failed step's aftermath (console.FOLLOW_ON):
        a ps prints dozens of 'RecvTensor cancelled' lines when one worker's step fails, and
        they bury the line that says why; the count says they exist and where to read them."""
        counts: dict[str, int] = {}
        for role, shown in self._filters:
            if shown.follow_on:
                counts[role] = counts.get(role, 0) + shown.follow_on
        if not counts or self.console_chatter:  # with --console_chatter they were printed
            return
        by_role = ", ".join(f"{role} {n}" for role, n in counts.items())
        say(
            f"{sum(counts.values())} follow-on lines of a failed step ('RecvTensor cancelled', "
            f"rendezvous aborted, cancelled remote calls) not shown: {by_role} (in their logs)"
        )
