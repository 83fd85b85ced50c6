"""Linux network namespaces: a private network for a local cluster, and virtual LANs of "machines".

TensorFlow's gRPC server has no authentication and no encryption, and it
listens on ``0.0.0.0:port`` whatever address the cluster names. On one
machine, the only isolation that works is a network the rest of the machine
cannot reach: a fresh network namespace that holds nothing but a loopback
device. ``tfdist-launch --private_network`` runs the whole cluster in one.

Two ways to get one:

* ``netns`` (root, iproute2): ``ip netns add``, loopback up, every process
  started with ``ip netns exec``; deleted when the job ends.
* ``unshare`` (any user where unprivileged user namespaces are allowed):
  ``unshare -rn`` gives a new user and network namespace; it disappears with
  its last process.

`VirtualLan` builds several namespaces ("hosts") joined by veth pairs to a
bridge in a "switch" namespace, each with its own address: the tests use it
to run a cluster across what look like separate machines, and to cut one
host's link. Nothing of it is visible from the host's own namespace: every
link and address lives inside the namespaces.

Namespace names carry the creating process's pid (``tfd-<tag>-<pid>-<hex>``)
so that `sweep_stale` can remove those left behind by a process that was
killed before it could clean up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Sequence

PREFIX = "tfd-"
_NAME_RE = re.compile(rf"^{PREFIX}[a-z0-9]+-(\d+)-[0-9a-f]+(?:-[a-z0-9]+)?$")


class NetnsError(RuntimeError):
    """A network namespace could not be created or configured; the message names the fix."""


# -- what this machine allows ----------------------------------------------------

def ip_binary() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip")
                                       if os.access(p, os.X_OK)), None)


def _ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    ip = ip_binary()
    if ip is None:
        raise NetnsError("iproute2's `ip` is not installed; install it (apt-get install iproute2).")
    result = subprocess.run([ip, *args], capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {(result.stderr or result.stdout).strip()}")
    return result


def netns_unavailable_reason() -> str | None:
    """Why `ip netns` cannot be used here (not root, no `ip`, not permitted), or None when it can."""
    if os.geteuid() != 0:
        return f"network namespaces with `ip netns` need root (running as uid {os.geteuid()})"
    if ip_binary() is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = Namespace("probe")
    try:
        probe.create()
    except (NetnsError, OSError, subprocess.SubprocessError) as e:
        return f"`ip netns add` is not permitted here ({e})"
    finally:
        probe.delete()
    return None


def unshare_unavailable_reason() -> str | None:
    """Why `unshare -rn` (an unprivileged user + network namespace) cannot be used here, or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "util-linux's `unshare` is not installed"
    try:
        result = subprocess.run([unshare, "-rn", "true"], capture_output=True, text=True, timeout=30,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`unshare -rn` could not run ({e})"
    if result.returncode != 0:
        return (f"`unshare -rn` is not permitted here ({result.stderr.strip() or result.returncode}); "
                f"unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone "
                f"or user.max_user_namespaces)")
    return None


def private_network_method(requested: str = "auto") -> tuple[str, str | None]:
    """('netns' or 'unshare', None), or (requested, why it cannot be used)."""
    if requested in ("auto", "netns"):
        reason = netns_unavailable_reason()
        if reason is None:
            return "netns", None
        if requested == "netns":
            return "netns", reason
        fallback = unshare_unavailable_reason()
        if fallback is None:
            return "unshare", None
        return "auto", f"{reason}; and {fallback}"
    if requested == "unshare":
        return "unshare", unshare_unavailable_reason()
    raise ValueError(f"unknown private network method {requested!r}; use auto, netns or unshare.")


# -- this process's own namespace ------------------------------------------------

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def bring_loopback_up() -> None:
    """Sets `lo` up in the current network namespace (a fresh one has it down), without `ip`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request + b"\0" * 22)[:18])[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP) + b"\0" * 22)


def netns_inode(pid: int | str = "self") -> int | None:
    """The inode that identifies the network namespace of a process (None if it cannot be read)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    """Processes (that this user may inspect) whose network namespace is `inode`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and netns_inode(entry) == inode:
            pids.append(int(entry))
    return pids


def kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# -- named namespaces (root) -----------------------------------------------------

def unique_name(tag: str, suffix: str = "") -> str:
    """``tfd-<tag>-<pid>-<hex>[-suffix]``: unique, and tells `sweep_stale` who created it."""
    tag = re.sub(r"[^a-z0-9]", "", tag.lower()) or "ns"
    return f"{PREFIX}{tag}-{os.getpid()}-{secrets.token_hex(3)}" + (f"-{suffix}" if suffix else "")


class Namespace:
    """One named network namespace (``/run/netns/<name>``) with its loopback up."""

    def __init__(self, tag: str = "ns", *, name: str | None = None):
        self.name = name or unique_name(tag)
        self.created = False

    def create(self) -> "Namespace":
        _ip("netns", "add", self.name)
        self.created = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        return self

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a program inside this namespace."""
        return [ip_binary() or "ip", "netns", "exec", self.name]

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _ip("-n", self.name, *args, check=check)

    def pids(self) -> list[int]:
        result = _ip("netns", "pids", self.name, check=False)
        return [int(p) for p in result.stdout.split() if p.isdigit()]

    def delete(self, *, kill: bool = True) -> None:
        """Kills what still runs inside (SIGKILL) and deletes the namespace; safe to call twice."""
        if not os.path.exists(f"/run/netns/{self.name}"):
            self.created = False
            return
        if kill:
            for _ in range(50):
                pids = self.pids()
                if not pids:
                    break
                kill_pids(pids)
                time.sleep(0.1)
        _ip("netns", "del", self.name, check=False)
        self.created = False

    def __enter__(self) -> "Namespace":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.delete()


def list_namespaces() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except OSError:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Deletes ``tfd-*`` namespaces whose creating process is gone and in which nothing runs."""
    removed = []
    for name in list_namespaces():
        match = _NAME_RE.match(name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        ns = Namespace(name=name)
        with contextlib.suppress(NetnsError, OSError, subprocess.SubprocessError):
            if not ns.pids():
                ns.delete(kill=False)
                removed.append(name)
    return removed


class VirtualLan:
    """Hosts on a private LAN: one namespace per host, veth pairs into a bridge in a "switch" namespace.

        switch namespace:  br0 ── v0, v1, v2 ...
        host i namespace:  eth0 (10.231.0.<i+1>/24) ── peer of v<i>;  lo

    Every link and address exists only inside these namespaces; the host's own
    namespace gains nothing and cannot reach them. `set_link(host, up=False)`
    cuts one host off the LAN (its eth0 goes down, and the switch port loses
    carrier), as a pulled cable or a partitioned node would.
    """

    def __init__(self, hosts: Sequence[str], *, subnet: str = "10.231.0", tag: str = "lan"):
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"hosts must be distinct and non-empty, got {list(hosts)}.")
        if len(hosts) > 250:
            raise ValueError("a VirtualLan holds at most 250 hosts.")
        base = unique_name(tag)
        self.hosts = list(hosts)
        self.subnet = subnet
        self.switch = Namespace(name=f"{base}-sw")
        self.namespaces = {h: Namespace(name=f"{base}-h{i}") for i, h in enumerate(self.hosts)}

    def address(self, host: str) -> str:
        return f"{self.subnet}.{self.hosts.index(host) + 1}"

    def exec_prefix(self, host: str) -> list[str]:
        return self.namespaces[host].exec_prefix()

    def create(self) -> "VirtualLan":
        try:
            self.switch.create()
            self.switch.ip("link", "add", "br0", "type", "bridge")
            # No spanning tree and no forwarding delay: ports forward as soon as they are up.
            self.switch.ip("link", "set", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
            self.switch.ip("link", "set", "br0", "up")
            for i, host in enumerate(self.hosts):
                ns = self.namespaces[host].create()
                self.switch.ip("link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns.name)
                self.switch.ip("link", "set", f"v{i}", "master", "br0")
                self.switch.ip("link", "set", f"v{i}", "up")
                ns.ip("addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                ns.ip("link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def set_link(self, host: str, *, up: bool) -> None:
        """Takes `host`'s link to the LAN down (a partition) or brings it back up."""
        self.namespaces[host].ip("link", "set", "eth0", "up" if up else "down")

    def pids(self) -> list[int]:
        return [pid for ns in self.namespaces.values() for pid in ns.pids()]

    def close(self) -> None:
        """Kills every process inside and deletes every namespace (the veth pairs go with them)."""
        for ns in [*self.namespaces.values(), self.switch]:
            with contextlib.suppress(NetnsError, OSError, subprocess.SubprocessError):
                ns.delete()

    def __enter__(self) -> "VirtualLan":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()


def connect(host: str, port: int, timeout: float = 2.0) -> int:
    """0 when a TCP connection to host:port succeeds, else the errno (ETIMEDOUT on a timeout)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return 0
    except socket.timeout:
        return errno.ETIMEDOUT
    except OSError as e:
        return e.errno or -1


_CLONE_NEWNET = 0x40000000


def connect_in_netns_of(pid: int, host: str, port: int, timeout: float = 2.0) -> int:
    """`connect` from inside the network namespace of process `pid` (root): 0, or the errno.

    Runs in a short-lived thread that joins the namespace with setns(2), so this
    process's own network stays as it was. Useful to probe a task that runs in
    a private network, which the host's namespace cannot reach.
    """
    import ctypes
    import threading

    result: list[int] = []

    def probe():
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        except OSError as e:
            result.append(e.errno or -1)
            return
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                result.append(ctypes.get_errno() or -1)
                return
        finally:
            os.close(fd)
        result.append(connect(host, port, timeout))

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join()
    return result[0]
