"""--private_network: the launcher re-runs itself inside a fresh network namespace."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from tfdist_trainer.errors import exit_code
from tfdist_trainer.launch import (
    process_group,
)
from tfdist_trainer.launch.flags import FLAGS, FORWARDED_FLAGS
from tfdist_trainer.launch.say import error, say

if TYPE_CHECKING:
    from tfdist_trainer.launch.netns import Namespace


def run_in_private_network(train_args: list[str]) -> int:
    """--private_network: runs this launcher again inside a fresh network namespace; returns its exit code.

    The namespace holds only loopback: the tasks reach each other on
    127.0.0.1, and nothing outside it can reach them. It is deleted (with
    anything still running in it) however the job ends.
    """
    method = _private_network_method()
    inner = _inner_launcher_command(train_args)
    if method == "netns":
        namespace, command = _netns_command(inner)
    else:
        namespace, command = None, _unshare_command(inner)
    inode = None
    interrupted: list[int] = []
    started: list[subprocess.Popen] = []
    _forward_signals(started, interrupted)
    try:
        process = _start_inner_launcher(command, started, interrupted)
        inode = _inner_netns_inode(process)
        code = _wait_for_exit_code(process)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_still_running(started)
        _delete_private_network(namespace, inode)
    if interrupted and code == 0:
        code = 128 + interrupted[0]
    return code


def _private_network_method() -> str:
    """'netns' or 'unshare': how this machine can make the namespace.

    A --host other than loopback, or a machine that allows neither way, ends
    here in one sentence and exit 2, before anything is created.
    """
    from tfdist_trainer.launch import netns

    if FLAGS.host not in ("127.0.0.1", "localhost"):
        error(
            f"--host={FLAGS.host} cannot be reached inside a private network, which has only loopback; "
            f"drop --host or --private_network."
        )
    method, reason = netns.private_network_method(FLAGS.private_network_via)
    if reason:
        error(
            f"--private_network cannot create a network namespace: {reason}; run as root with iproute2, "
            f"or allow unprivileged user namespaces, or drop --private_network."
        )
    return method


def _inner_launcher_command(train_args: list[str]) -> list[str]:
    """This launcher again, with the flags the user gave, told that it already runs inside."""
    return [
        sys.executable,
        "-m",
        "tfdist_trainer.launch.main",
        *(FLAGS[name].serialize() for name in FORWARDED_FLAGS if FLAGS[name].present),
        "--in_private_network",
        "--",
        *train_args,
    ]


def _netns_command(inner: list[str]) -> tuple[Namespace, list[str]]:
    """A fresh `ip netns` namespace (stale ones of killed launchers swept first) and `inner` in it.

    Returns the namespace, which the caller deletes at the end, and the command.
    """
    from tfdist_trainer.launch import netns

    netns.sweep_stale()
    try:
        namespace = netns.Namespace("launch").create()
    except netns.NetnsError as e:
        error(f"--private_network: {e}")
    say(
        f"private network: namespace {namespace.name}, loopback only; its ports cannot be reached from "
        f"this host's network"
    )
    return namespace, [*namespace.exec_prefix(), *inner]


def _unshare_command(inner: list[str]) -> list[str]:
    """`inner` in a new user and network namespace, which disappears with its last process."""
    command = [
        shutil.which("unshare") or "unshare",
        "--user",
        "--map-root-user",
        "--net",
        "--",
        *inner,
    ]
    say(
        "private network: a new user and network namespace (unshare -rn), loopback only; its ports "
        "cannot be reached from this host's network"
    )
    return command


def _forward_signals(started: list[subprocess.Popen], interrupted: list[int]) -> None:
    """Passes SIGTERM and SIGINT on to the inner launcher's group, and notes them in `interrupted`.

    Ctrl-C reaches only this process: the inner launcher has its own session.
    """

    def forward(signum, frame):
        interrupted.append(signum)
        if started:
            process_group.signal_group(started[0], signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)


def _start_inner_launcher(
    command: list[str], started: list[subprocess.Popen], interrupted: list[int]
) -> subprocess.Popen:
    """Starts the inner launcher in its own session; a signal that came before it existed is
    passed on now (the handler had nothing to send it to)."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    started.append(process)
    if interrupted:
        process_group.signal_group(process, interrupted[0])
    return process


def _inner_netns_inode(process: subprocess.Popen) -> int | None:
    """The inner launcher's network namespace, to find anything left in it at the end.

    It enters the namespace a moment after it starts: asked for up to 5 s, None if
    it never shows one other than this process's.
    """
    from tfdist_trainer.launch import netns

    for _ in range(100):
        current = netns.netns_inode(process.pid)
        if current is None or current != netns.netns_inode():
            return current
        time.sleep(0.05)
    return None


def _wait_for_exit_code(process: subprocess.Popen) -> int:
    """The inner launcher's exit code, waited for in 1 s slices so that signals are handled meanwhile."""
    while True:
        try:
            return exit_code(process.wait(timeout=1.0))
        except subprocess.TimeoutExpired:
            continue


def _stop_still_running(started: list[subprocess.Popen]) -> None:
    """Only on an unexpected error here: the inner launcher gets SIGTERM and the time to stop its
    cluster first, SIGKILL after."""
    for process in started:
        if process.poll() is None:
            process_group.signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=2 * FLAGS.grace_s + 10)
            except subprocess.TimeoutExpired:
                process_group.signal_group(process, signal.SIGKILL)
                process.wait()


def _delete_private_network(namespace: Namespace | None, inode: int | None) -> None:
    """Deletes the `ip netns` namespace, or kills what is left in the unshare one (which then goes
    with its last process), saying how many processes were left behind."""
    from tfdist_trainer.launch import netns

    if namespace is not None:
        left = namespace.pids()
        namespace.delete()
        say(
            f"deleted namespace {namespace.name}"
            + (f" (killed {len(left)} leftover processes)" if left else "")
        )
    elif inode is not None:
        left = netns.pids_in_netns(inode)
        netns.kill_pids(left)
        if left:
            say(f"killed {len(left)} leftover processes of the private network")
