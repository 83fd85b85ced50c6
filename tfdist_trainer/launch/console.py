"""Which of a task's output lines reach the console; the task's log file keeps every line.

TensorFlow prints a dozen lines at every start (the absl banner, oneDNN, "no
CUDA drivers", a failed ``cuInit`` on a machine without a GPU, how its
strategies set themselves up) and, when a multi_worker_mirrored leader exits
before its peers, gRPC errors about a heartbeat that found no one to talk to.
They say nothing about the job, and some look like failures.
:class:`ConsoleFilter` keeps exactly those known lines off the console. It is
deliberately narrow:

* a line is hidden only when it matches one of the known patterns below, or
  is a continuation line of such a record (the protobuf dump after TF's
  session config, the gRPC details after a shutdown error);
* lines that signal a failure (a Python traceback, an exception, an OOM, a
  crash, a non-zero exit) are always shown, with the lines that follow them;
* the shutdown chatter is hidden only once a driving task has finished with
  exit code 0 (``job_finished``); before that the same lines mean a lost peer;
* the follow-on lines of a failed step (``FOLLOW_ON``: TensorFlow cancelling the
  step's pending transfers and remote calls, dozens on a ps) are hidden and
  counted (``ConsoleFilter.follow_on``): they never name the cause, and the
  launcher prints one line with their number instead.

``info_from`` narrows the view further (the MNIST demo shows only progress):
INFO records from other source files are hidden, never warnings or errors.
A record spans several lines (a table, a traceback); its continuation lines
follow the fate of its first line, so a table is shown whole or not at all.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator

#: absl's header, Python (``I1123 07:48:48.415137 1406...``) or C++ (``I0000 00:00:1795420114.80 5278``).
ABSL_HEADER = re.compile(
    r"^(?P<level>[IWEF])\d{4} (?P<time>[\d:.]+)\s+\d+ (?P<file>[\w.\-]+):\d+\] ?"
)
#: A role prefix the launcher or the task put in front: ``[worker:1] `` or ``[local] ``.
_ROLE = re.compile(r"^\[(?:[\w\-]+:\d+|local)\] ")

#: Start-up lines of every TensorFlow process: (source file, or None for a line without a header, pattern).
STARTUP_CHATTER = (
    (None, re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called")),
    ("port.cc", re.compile(r"^oneDNN custom operations are on\.")),
    ("cudart_stub.cc", re.compile(r"^Could not find cuda drivers on your machine")),
    ("cpu_feature_guard.cc", re.compile(r"^This TensorFlow binary is optimized to use")),
    (None, re.compile(r"^To enable the following instructions: .* rebuild TensorFlow")),
    # tf.data under a ClusterCoordinator's per-worker datasets: harmless, once per pipeline.
    ("dataset.cc", re.compile(r"^Input of GeneratorDatasetOp::Dataset will not be optimized")),
    # A finished step's or iterator's leftover transfers being dropped, not an error of the step.
    (
        "local_rendezvous.cc",
        re.compile(
            r"^Local rendezvous is aborting with status: "
            r"(ABORTED: Cleanup -?\d+|OUT_OF_RANGE: End of sequence)"
        ),
    ),
)
#: INFO records of TensorFlow's own distribution and checkpoint code: how it set itself up, every time.
TF_INFO_SOURCES = (
    "mirrored_strategy.py",
    "collective_all_reduce_strategy.py",
    "cross_device_ops.py",
    "parameter_server_strategy.py",
    "parameter_server_strategy_v2.py",
    "remote.py",  # the session config, a protobuf dump on the lines after it
    "cluster_coordinator.py",
    # tf.train.Coordinator: "Error reported to Coordinator: <the error>", a copy of the traceback
    # the task then dies of (the launcher prints that one once).
    "coordinator.py",
    "functional_saver.py",
    # tf.train.checkpoints_iterator: "Waiting for new checkpoint at ...", once a second.
    "checkpoint_utils.py",
    # Writing a SavedModel (an export): renamed inputs, "Assets written to", "Writing fingerprint".
    "signature_serialization.py",
    "builder_impl.py",
    "fingerprinting_utils.py",
    # gin resolving `include 'strategies/x.gin'` on its search path: system_path_file_exists:<path>.
    "resource_reader.py",
    # matplotlib (imported through tensorflow-datasets) building its font cache on a fresh HOME.
    "font_manager.py",
)
#: INFO records of the package's own that are for the task's log file, not the console: the
#: model-parallel per-layer table (hundreds of lines for a real model; the console has one line per
#: device and placement.json the whole table).
LOG_ONLY_SOURCES = ("layer_table.py",)
#: A serving task's routine INFO records (a parameter_server worker or ps saying it serves, that the
#: chief is up, that it exits after the chief): 3-5 lines per task, 48 before the first step at 16
#: tasks. Under a launcher, whose own lines say when tasks start and end, they go to the logs only
#: (`serving_routine=False`); a task started by hand keeps them on its console.
SERVING_ROUTINE = (
    ("cli.py", re.compile(r"^serve as \S+ under ")),
    (
        "serve.py",
        re.compile(r"^serving at |^chief \S+ is up$|^the chief marked training done: exiting"),
    ),
    ("shutdown.py", re.compile(r"^the chief exited \(|^the other tasks exited \(")),
)
#: cuInit's answer on a machine with no NVIDIA device; with one, the same line is a real problem.
NO_GPU_CUINIT = ("cuda_platform.cc", re.compile(r"^failed call to cuInit: .*\((303|100)\)$"))
#: Once the job's training finished: a peer whose coordination-service leader has already exited
#: (an error record and the gRPC details on the lines after it).
SHUTDOWN_CHATTER = re.compile(
    r"Failed to send RPC to coordination service|/tensorflow\.CoordinationService/"
    r"|Error received from peer .*(Connection refused|Socket closed|failed to connect)"
    r"|coordination service .*(shut ?down|unavailable|not reachable)"
)

#: What the tasks print once a step failed somewhere (a bad id on one worker, a lost peer): TF
#: cancelling the step's pending transfers (a ps prints one 'RecvTensor cancelled' per variable it
#: was sending: 84 for one bad batch of the tiny sharded-embedding recipe) and its remote calls.
#: The error itself is elsewhere (the failing task's traceback); these only follow from it.
FOLLOW_ON = (
    ("grpc_worker_service.cc", re.compile(r"^RecvTensor cancelled for ")),
    # Any status: a step that failed on another task (a capacity check on a ps) aborts every
    # task's transfers, each repeating the error; the task that ran the step reports it once.
    ("local_rendezvous.cc", re.compile(r"^Local rendezvous is aborting with status: ")),
    # A task sending a failed step's error on to its caller (the caller reports it).
    ("grpc_util.h", re.compile(r"^Truncated error message: ")),
    # The coordinator (un)registering functions on a worker that died: one notice per function
    # (dozens), after its own 'Worker ... failed' line and the launcher's.
    ("context.cc", re.compile(r"^Failed to (?:register|remove) function remotely due to ")),
    # The coordinator re-forming the cluster without the lost worker.
    (
        "context_distributed_manager.cc",
        re.compile(r"^Device filters can only be specified when initializing the cluster"),
    ),
    # The coordinator dropping its handles to a cancelled closure's outputs on the worker.
    (
        "destroy_tensor_handle_node.h",
        re.compile(r"^Ignoring an error encountered when deleting remote tensors handles"),
    ),
    # "This derived error is ignored and not reported to users." (TF's own words, on the next line).
    (
        "cluster_coordinator.py",
        re.compile(r"^Remote function on worker \S+ failed with CancelledError"),
    ),
)
#: The lines after a FOLLOW_ON record that belong to it (the gRPC details of a remote call, TF's
#: note on a derived error, the node of a status); any other line after one is shown.
FOLLOW_ON_DETAILS = re.compile(
    r"^Additional GRPC error information from remote target "
    r"|^:UNKNOWN:Error received from peer "
    r"|^This derived error is ignored and not reported to users\.$"
    r"|^This could happen if the remote target has been disconnected from the client\.$"
    r"|^\s+\[\[.*\]\]"  # the node a status came from: "\t [[{{node while/LoopCond/_53}}]]"
    r"|^\s+\(\d+\) [A-Z_]+: "  # one of "3 root error(s) found." ("  (0) INVALID_ARGUMENT: ...")
    r"|^\d+ successful operations\.$|^\d+ derived errors ignored\.$"
)

#: Lines that signal a failure, or a warning in Python's own format: never hidden.
FAILURE = re.compile(
    r"Traceback \(most recent call last\)"
    r"|^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::|$)"
    r"|^\S+:\d+: \w*Warning: "
    r"|\bOOM\b|out of memory|ResourceExhausted|MemoryError"
    r"|Fatal Python error|Segmentation fault|core dumped|\bKilled\b|Aborted|Check failed"
    r"|exited with code|exit code [1-9]|^error:|\berror: "
)

_SHOWN, _CHATTER, _QUIET, _FOLLOW_ON = "shown", "chatter", "quiet", "follow-on"


def gpu_present() -> bool:
    """An NVIDIA device node or driver exists on this machine."""
    return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))


class ConsoleFilter:
    """``filter(line) -> bool``: whether a line of one task's output goes to the console too.

    Args:
      job_finished: returns True once a driving task has finished with exit
        code 0 (then gRPC shutdown errors are chatter); None: never.
      info_from: if given, only INFO records from these source files are shown
        (warnings, errors and failures always are).
      gpu: whether this machine has an NVIDIA GPU (default: looked up).
      serving_routine: whether serving tasks' routine records (`SERVING_ROUTINE`) are shown;
        the launcher hides them.

    One instance follows one stream; lines of several tasks, each with its role
    prefix, may share an instance: a record's state is kept per prefix.
    ``follow_on`` counts the FOLLOW_ON records it hid (their first lines).
    """

    def __init__(
        self,
        *,
        job_finished: Callable[[], bool] | None = None,
        info_from: tuple[str, ...] | None = None,
        gpu: bool | None = None,
        serving_routine: bool = True,
    ):
        self._job_finished = job_finished or (lambda: False)
        self._serving_routine = serving_routine
        self._info_from = info_from
        self._gpu = gpu_present() if gpu is None else gpu
        self._state: dict[str, str] = {}  # role prefix -> state of its current record
        self.follow_on = 0

    def __call__(self, line: str) -> bool:
        role = _ROLE.match(line)
        key = role.group(0) if role else ""
        text = line[role.end() :] if role else line
        header = ABSL_HEADER.match(text)
        if header:
            state = self._classify(
                header.group("level"), header.group("file"), text[header.end() :]
            )
            self._state[key] = state
            self.follow_on += state == _FOLLOW_ON
            return state == _SHOWN
        # A line without a header: a record's continuation, or plain output.
        if self._state.get(key) == _FOLLOW_ON and FOLLOW_ON_DETAILS.search(text):
            return False
        if FAILURE.search(text) and not self._is_shutdown_chatter(text):
            self._state[key] = _SHOWN  # the details on the lines after it follow
            return True
        if record_matches(None, text, STARTUP_CHATTER) or self._is_shutdown_chatter(text):
            self._state[key] = _CHATTER
            return False
        state = self._state.get(key, _SHOWN)
        if state == _QUIET:
            return False
        self._state[key] = _SHOWN  # plain output after chatter is not chatter
        return True

    def _is_shutdown_chatter(self, text: str) -> bool:
        return bool(SHUTDOWN_CHATTER.search(text)) and self._job_finished()

    def _classify(self, level: str, source: str, message: str) -> str:
        if record_matches(source, message, STARTUP_CHATTER):
            return _CHATTER
        if level in "EW" and record_matches(source, message, FOLLOW_ON):
            return _FOLLOW_ON
        if not self._gpu and record_matches(source, message, (NO_GPU_CUINIT,)):
            return _CHATTER
        if level in "EW" and self._is_shutdown_chatter(message):
            return _CHATTER
        if (
            level == "I"
            and source in TF_INFO_SOURCES + LOG_ONLY_SOURCES
            and not FAILURE.search(message)
        ):
            return _QUIET
        if (
            level == "I"
            and not self._serving_routine
            and record_matches(source, message, SERVING_ROUTINE)
        ):
            return _QUIET
        if level == "I" and self._info_from is not None and source not in self._info_from:
            return _SHOWN if FAILURE.search(message) else _QUIET
        return _SHOWN


def record_matches(source: str | None, message: str, patterns) -> bool:
    """Whether a record from `source` matches one of `patterns`' (source file or None, regex) pairs."""
    return any(
        (file is None or file == source) and pattern.search(message) for file, pattern in patterns
    )


def strip_role(line: str) -> str:
    """The line without its leading role prefix ("[worker:1] ", "[local] "), if any.

    One task's header lines carry the prefix the task printed and its other lines
    the one the launcher adds; a per-task filter fed bare lines keeps one record
    state for both.
    """
    role = _ROLE.match(line)
    return line[role.end() :] if role else line


def error_sentence(line: str) -> str | None:
    """The sentence of a task's one-line error (``[worker:1] error: <sentence>``, as
    `tfdist-train` ends a task with a ConfigError), or None for any other line."""
    text = strip_role(line)
    return text[len("error: ") :] if text.startswith("error: ") and text != line else None


def strip_header(line: str) -> str:
    """``[chief:0] I1123 07:48:48.41 1406 controller.py:91] step 10`` -> ``[chief:0] step 10``."""
    role = _ROLE.match(line)
    text = line[role.end() :] if role else line
    header = ABSL_HEADER.match(text)
    if not header:
        return line
    return (role.group(0) if role else "") + text[header.end() :]


def short_line(line: str) -> str:
    """A task line as the console shows it: absl's header cut to the time, and the level only for a
    warning or worse (the task's log file keeps the whole header).

    ``[chief:0] I1125 10:06:13.424594 1399 cli.py:139] step 10`` -> ``[chief:0] 10:06:13 step 10``;
    ``[chief:0] W1125 10:06:13.4 1399 x.py:9] careful`` -> ``[chief:0] 10:06:13 W careful``. A C++
    header (``E0000 00:00:1795608283.36 30166 context.cc:911]``: seconds since the epoch) gets
    this machine's local time. A line without a header is returned as it is.
    """
    role = _ROLE.match(line)
    text = line[role.end() :] if role else line
    header = ABSL_HEADER.match(text)
    if not header:
        return line
    hours, minutes, seconds = (header.group("time").split(":", 2) + ["", ""])[:3]
    try:
        if float(seconds) >= 60:  # C++: '00:00:<seconds since the epoch>'
            clock = time.strftime("%H:%M:%S", time.localtime(float(seconds)))
        else:
            clock = f"{hours}:{minutes}:{seconds.split('.')[0]}"
    except ValueError:
        return line
    level = header.group("level")
    return (
        (role.group(0) if role else "")
        + clock
        + ("" if level == "I" else f" {level}")
        + " "
        + text[header.end() :]
    )


@contextlib.contextmanager
def quiet_stderr(keep: Callable[[str], bool] | None = None) -> Iterator[None]:
    """Runs the block with this process's stderr (file descriptor 2, so TF's C++ lines too) going
    through a ConsoleFilter: known chatter is dropped, every other line is passed on as it comes.

    For the launcher's own start-up (importing the user's Trainer, or checking a
    model_dir through tf.io.gfile, starts TensorFlow); the tasks' own start-up is in
    their logs, which have the same TensorFlow start-up lines.
    """
    keep = keep or ConsoleFilter()
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                if keep(raw.decode(errors="replace").rstrip("\n")):
                    os.write(real, raw)

    thread = threading.Thread(target=pump, name="quiet_stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # closes the pipe's last write end: the pump reads to the end and stops
        thread.join(timeout=10)
        os.close(real)
