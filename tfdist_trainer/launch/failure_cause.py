"""Why a task failed, in one line: its traceback held back from the console, and the cause read from it.

The launcher prints the first failing task's traceback once and one line for each other
failure (several workers failing alike printed the same traceback each, interleaved);
`TracebackHold` holds a task's traceback until its fate is known and reads its cause,
down to the op's own message inside a TensorFlow graph error. Which lines reach the
console at all is `console.ConsoleFilter`'s job.
"""

from __future__ import annotations

import re

from tfdist_trainer.launch.console import ABSL_HEADER, record_matches, strip_role


class TracebackHold:
    """Holds a task's Python traceback back from the console until the task's fate is known.

    ``feed(line)`` returns the lines to print now: none while a traceback is open (from
    ``Traceback (most recent call last):`` on, with whatever follows it); an INFO record
    means the task went on (an exception it logged), and releases the held lines with it.
    When the task has ended, `held` is the traceback it died of, and `cause()` its one line.
    The launcher prints the first failing task's traceback once, and one line for each
    other task (several workers failing alike printed the same traceback each, interleaved).
    Lines are kept with their role prefix, as they were fed.

    A ClusterCoordinator logs a closure's error twice before it raises it (``RAISED_NEXT``),
    each time with the whole graph stack (90 lines for a bad id in the sharded-embedding
    recipe): such a record opens the hold too, and `traceback()` leaves it out when the
    task then dies of the error; a task that goes on gets it back with `release()`.
    """

    def __init__(self) -> None:
        self.held: list[str] = []

    def feed(self, line: str) -> list[str]:
        text = strip_role(line)
        if self.held:
            header = ABSL_HEADER.match(text)
            if header and header.group("level") == "I":
                return [*self.release(), line]
            self.held.append(line)
            return []
        if text.startswith(_TRACEBACK) or _raised_next(text):
            self.held.append(line)
            return []
        return [line]

    def release(self) -> list[str]:
        held, self.held = self.held, []
        return held

    def traceback(self) -> list[str]:
        """The held lines to print for a task that died: all of them, less the records that copy the
        error it raised (`RAISED_NEXT`) when the error itself is held too: its traceback, or the
        one sentence the task ends with (``error: ...``, when the package names the cause)."""
        if not any(_is_the_error(strip_role(line)) for line in self.held):
            return list(self.held)
        kept, copy = [], False
        for line in self.held:
            text = strip_role(line)
            if ABSL_HEADER.match(text) or _is_the_error(text):
                copy = _raised_next(text)
            if not copy:
                kept.append(line)
        return kept

    def named_its_error(self) -> bool:
        """Whether the task ended with its own one sentence (``error: ...``) and no traceback: then
        that sentence is the whole report."""
        texts = [strip_role(line) for line in self.held]
        return any(t.startswith(_ONE_SENTENCE) for t in texts) and not any(
            t.startswith(_TRACEBACK) for t in texts
        )

    def cause(self) -> str | None:
        """The exception line of the held traceback (the last one, in a chain), without its module
        path: ``RuntimeError: boom``; None if nothing is held or it has no exception line yet.

        For a TensorFlow graph error ("InvalidArgumentError: Graph execution error:") it is the
        innermost message instead, which names what went wrong (`_graph_error_message`)."""
        cause, in_frames, details = None, False, []
        for line in self.held:
            text = strip_role(line)
            if text.startswith(_TRACEBACK):
                in_frames = True
            elif in_frames and text.strip() and not text[0].isspace():
                cause, in_frames, details = text.strip(), False, []
            elif cause is not None:
                details.append(text)
        if cause is None:
            return None
        cause = _without_function_node(cause)
        inner = _graph_error_message(details) if cause.endswith(_GRAPH_ERROR) else None
        if inner:
            cause = cause[: -len(_GRAPH_ERROR)] + inner
        # TensorFlow's "TypeError: in user code:" ends in the error it wraps, indented.
        wrapped = [d.strip() for d in details if _EXCEPTION_LINE.match(d.strip())]
        if cause.endswith(":") and wrapped:
            cause = wrapped[-1]
        cause = re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*(?::|$))", "", cause)
        return cause if len(cause) <= 300 else cause[:297] + "..."


_TRACEBACK = "Traceback (most recent call last):"
#: How a task ends with one sentence (cli._fail): ``error: <what to fix>``.
_ONE_SENTENCE = "error: "


def _is_the_error(text: str) -> bool:
    return text.startswith(_TRACEBACK) or text.startswith(_ONE_SENTENCE)


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S")

#: Error records that copy the error their task raises next: tf.distribute's ClusterCoordinator
#: logs a closure's error when a worker reports it, and again just before raising it to the
#: caller (cluster_coordinator.py, TF 2.21).
RAISED_NEXT = (
    (
        "cluster_coordinator.py",
        re.compile(
            r"encountered the following error when processing closure: "
            r"|^Start cancelling closures due to error "
        ),
    ),
)


def _raised_next(text: str) -> bool:
    header = ABSL_HEADER.match(text)
    return (
        bool(header)
        and header.group("level") == "E"
        and record_matches(header.group("file"), text[header.end() :], RAISED_NEXT)
    )


# -- TensorFlow's graph errors -------------------------------------------------------------------
#
# An op that fails inside a tf.function raises "<Type>Error: Graph execution error:", then, for
# each node involved, "Detected at node <name> defined at (most recent call last):" with the
# Python frames that built it (indented File lines and blank lines), then the op's own message:
#
#   assertion failed: [table_3/embeddings: ids must be < 24 (the rows)] [Condition x < y ...] ...
#   \t [[{{node while/click_model_1/table_3_1/assert_less/Assert/AssertGuard/Assert}}]]
#
# or, when several devices failed, "2 root error(s) found." and "  (0) INVALID_ARGUMENT:  <msg>".

_GRAPH_ERROR = "Graph execution error:"
_DETECTED_AT = "Detected at node "
_ROOT_ERRORS = re.compile(r"^\d+ root error\(s\) found\.")
_ROOT_ERROR = re.compile(r"^\s*\(\d+\) [A-Z_]+: +(?P<message>\S.*)")
_NODE = re.compile(r"\{\{node (?P<name>[^}]+)\}\}")
#: Kept of an assertion's message: its first bracketed item (the assertion's own message, or
#: "Condition x < y did not hold element-wise:"); the data it prints after that is cut.
_ASSERTION = re.compile(r"^assertion failed: \[.*?\](?= \[|$)")
#: An eager op's error names the function TF wrapped it in: "{{function_node __wrapped__GatherV2_...}}".
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")


def _graph_error_message(details: list[str]) -> str | None:
    """The op's own message after a graph error's "Detected at node" stacks, with its node's name
    (an assertion's message names what it checks itself), or None if there is none."""
    lines = iter(details)
    for line in lines:
        if not line.strip() or line[0].isspace() or line.startswith(_DETECTED_AT):
            continue
        if _ROOT_ERRORS.match(line):
            root = next((m for m in map(_ROOT_ERROR.match, lines) if m), None)
            if root is None:
                return None
            line = root.group("message")
        message = _without_function_node(line)
        assertion = _ASSERTION.match(message)
        if assertion:
            return assertion.group(0)
        node = _NODE.search(next(lines, ""))
        return f"{message} (node {node.group('name')})" if node else message
    return None


def _without_function_node(message: str) -> str:
    """``{{function_node __wrapped__GatherV2_...}} indices[1] = 33 ... [Op:GatherV2] name: `` ->
    ``indices[1] = 33 ... [Op:GatherV2]``."""
    message = _FUNCTION_NODE.sub("", message).strip()
    return re.sub(r"\s+name:$", "", message)
