"""Security: `tfdist-launch --private_network` keeps the cluster's unauthenticated gRPC ports private.

TensorFlow's servers listen on 0.0.0.0 with no authentication. With
--private_network the launcher runs every task inside a fresh network
namespace that holds only loopback. The tests prove it while training runs:
each task's port accepts a connection from inside that namespace (probed
with setns(2) into the task's namespace) and refuses one from the host's
namespace at the same moment; and the job still trains to its exact step.

Also checked: the namespace is gone afterwards (also after Ctrl-C), no
process is left, the logs are readable by their owner only, and the
launcher does not log its environment.

The netns variant needs root and iproute2, the unshare variant unprivileged
user namespaces (util-linux `unshare -rn`); each skips with the reason when
it cannot run here. Probing inside a namespace needs root.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import clusterlib
import pytest
from clusterlib import FAST_MNIST, REPO, launch_cmd, read_records, strategy_gin
from netlab import VirtualLan, connect, connect_in_netns_of

from tfdist_trainer.launch import netns
from tfdist_trainer.launch.supervisor import started_tasks

STEPS = 150
TIMEOUT_S = 240
CANARY = "tfdist-canary-9f3c1d"  # an environment value that must appear in no log
_NAMESPACE = re.compile(r"^\[launch\] private network: namespace (\S+),", re.M)


def _require(method: str) -> None:
    reason = (
        netns.netns_unavailable_reason()
        if method == "netns"
        else netns.unshare_unavailable_reason()
    )
    if reason:
        pytest.skip(f"--private_network_via={method} cannot run here: {reason}")
    if os.geteuid() != 0:
        pytest.skip("probing a port inside another network namespace needs root")


def mnist_args(model_dir: str) -> list[str]:
    return [
        *FAST_MNIST,
        strategy_gin("multi_worker_mirrored"),
        f"--gin_bindings=train.train_steps={STEPS}",
        f"--model_dir={model_dir}",
    ]


class Launch(clusterlib.BackgroundJob):
    """tfdist-launch in the background, its output in a file."""

    timeout_s = TIMEOUT_S

    def __init__(self, launch_args: list[str], train_args: list[str], out_path: str):
        super().__init__(
            launch_cmd(launch_args, train_args),
            out_path,
            env=clusterlib.base_env({"TFDIST_TEST_CANARY": CANARY}),
        )

    def kill(self) -> None:
        self.stop(grace_s=30)

    def tasks_listening_inside(
        self, count: int, timeout: float = TIMEOUT_S
    ) -> dict[str, tuple[int, int]]:
        """Waits until `count` tasks were started and each accepts a connection inside its namespace."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tasks = {
                role: (int(pid), int(address.rsplit(":", 1)[1]))
                for role, pid, address in started_tasks(self.output())
            }
            if len(tasks) >= count and all(
                connect_in_netns_of(pid, "127.0.0.1", port, timeout=0.5) == 0
                for pid, port in tasks.values()
            ):
                return tasks
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the launcher exited ({self.proc.returncode}) before its tasks listened:\n"
                    f"{self.output()[-6000:]}"
                )
            time.sleep(0.2)
        raise AssertionError(
            f"the tasks did not listen within {timeout}s:\n{self.output()[-6000:]}"
        )


def assert_unreachable_from_host(
    tasks: dict[str, tuple[int, int]], output: str, within_s: float = 20
) -> None:
    """Every task's port refuses the host's namespace, and accepts inside its own at (about) the same moment.

    A multi_worker_mirrored task lets go of its port for an instant when TF's
    server takes it over, so the inside probe is retried; the host-side probe
    must fail every time.
    """
    for role, (pid, port) in tasks.items():
        assert netns.netns_inode(pid) != netns.netns_inode(), (
            f"{role} runs in the host's network namespace"
        )
        deadline = time.monotonic() + within_s
        while True:
            from_host = connect("127.0.0.1", port, timeout=1.0)
            assert from_host != 0, (
                f"{role}'s port {port} is reachable from the host's namespace:\n{output[-4000:]}"
            )
            assert from_host == errno.ECONNREFUSED, errno.errorcode.get(from_host, from_host)
            inside = connect_in_netns_of(pid, "127.0.0.1", port, timeout=1.0)
            if inside == 0:
                break
            assert time.monotonic() < deadline, (
                f"{role} does not listen inside its namespace: "
                f"{errno.errorcode.get(inside, inside)}"
            )
            time.sleep(0.1)


def assert_private_files(model_dir: str) -> None:
    """The launcher created model_dir and logs/ for its user only, and each log file 0600."""
    for path in (model_dir, os.path.join(model_dir, "logs")):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, f"{path}: {oct(os.stat(path).st_mode)}"
    logs = os.listdir(os.path.join(model_dir, "logs"))
    assert logs
    for name in logs:
        mode = stat.S_IMODE(os.stat(os.path.join(model_dir, "logs", name)).st_mode)
        assert mode == 0o600, f"logs/{name}: {oct(mode)}"


def assert_no_environment_logged(output: str, model_dir: str) -> None:
    assert CANARY not in output, "the launcher's output contains an environment value"
    for root, _, files in os.walk(model_dir):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                assert CANARY.encode() not in f.read(), (
                    f"{os.path.join(root, name)} contains an environment value"
                )


@pytest.mark.cluster
def test_private_network_netns_trains_and_hides_ports(tmp_path):
    """As root: `ip netns` namespace; ports unreachable from the host while training; deleted at the end."""
    _require("netns")
    model_dir = str(tmp_path / "model")
    job = Launch(
        ["--num_workers=2", "--private_network", "--private_network_via=netns"],
        mnist_args(model_dir),
        str(tmp_path / "launch.out"),
    )
    try:
        tasks = job.tasks_listening_inside(2)
        assert_unreachable_from_host(tasks, job.output())
        code = job.wait()
    finally:
        job.kill()
    out = job.output()
    assert code == 0, f"tfdist-launch exited {code}:\n{out[-8000:]}"
    names = _NAMESPACE.findall(out)
    assert len(names) == 1, out[-4000:]
    assert names[0] not in netns.list_namespaces(), f"namespace {names[0]} was left behind"
    assert f"[launch] deleted namespace {names[0]}" in out

    records = [r for r in read_records(model_dir) if r["kind"] == "train"]
    assert records and records[-1]["step"] == STEPS, records
    assert records[-1]["loss"] < records[0]["loss"]
    assert "strategy multi_worker_mirrored with 2 replica(s) in sync" in out
    assert clusterlib.no_process_left(model_dir) == []
    assert_private_files(model_dir)
    assert_no_environment_logged(out, model_dir)


@pytest.mark.cluster
def test_private_network_unshare_hides_ports_and_ctrl_c_cleans_up(tmp_path):
    """`unshare -rn` (no root needed): ports unreachable from the host; Ctrl-C stops everything (130)."""
    _require("unshare")
    model_dir = str(tmp_path / "model")
    job = Launch(
        ["--num_workers=2", "--private_network", "--private_network_via=unshare", "--grace_s=3"],
        mnist_args(model_dir),
        str(tmp_path / "launch.out"),
    )
    try:
        tasks = job.tasks_listening_inside(2)
        assert_unreachable_from_host(tasks, job.output())
        inode = netns.netns_inode(next(iter(tasks.values()))[0])
        os.kill(job.proc.pid, signal.SIGINT)  # what Ctrl-C sends to the launcher
        code = job.wait(timeout=60)
    finally:
        job.kill()
    out = job.output()
    assert code == 128 + signal.SIGINT, f"exit {code}, want 130:\n{out[-6000:]}"
    assert "received SIGINT; stopping the cluster" in out, out[-4000:]
    assert clusterlib.no_process_left(model_dir) == []
    assert inode is None or netns.pids_in_netns(inode) == [], (
        "processes are left in the private network"
    )
    assert_no_environment_logged(out, model_dir)


# -- errors, before anything starts ------------------------------------------------------


def test_private_network_rejects_another_host(tmp_path):
    model_dir = str(tmp_path / "model")
    r = clusterlib.run(
        launch_cmd(["--private_network", "--host=10.0.0.5"], mnist_args(model_dir)), timeout=60
    )
    assert r.returncode == 2, r.stdout[-3000:]
    errors = [line for line in r.stdout.splitlines() if line.startswith("[launch] error:")]
    assert len(errors) == 1 and "--host=10.0.0.5" in errors[0] and "only loopback" in errors[0], (
        r.stdout
    )
    assert "Traceback" not in r.stdout
    assert not os.path.exists(model_dir)


NOBODY = 65534

# Run by the launcher's Python as root: prints where the packages the launcher imports live,
# those that are not part of Python itself (tfdist_trainer, absl, gin), one path a line.
_LAUNCHER_PACKAGES = """
import os, sys
import tfdist_trainer.plan.gin_config, tfdist_trainer.launch.main, tfdist_trainer.launch.netns
for name in sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)):
    file = getattr(sys.modules[name], "__file__", None)
    if name.startswith("_") or not file:
        continue
    print(os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file)
"""

# Runs the launcher (argv after -c) with os.geteuid() answering nobody's uid.
_LAUNCH_AS_IF_NOBODY = f"""
import os, runpy
os.geteuid = lambda: {NOBODY}
runpy.run_module("tfdist_trainer.launch.main", run_name="__main__", alter_sys=True)
"""


def _as_nobody(setpriv: str) -> list[str]:
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


def _readable_copy_of_launcher(root: str) -> None:
    """Copies the launcher's packages into `root`, every directory 0755 and every file 0644."""
    listed = subprocess.run(
        [clusterlib.PYTHON, "-c", _LAUNCHER_PACKAGES],
        capture_output=True,
        text=True,
        env=clusterlib.base_env(),
        cwd=REPO,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    paths = listed.stdout.split()
    assert any(os.path.basename(p) == "tfdist_trainer" for p in paths), paths
    for path in paths:
        target = os.path.join(root, os.path.basename(path))
        if os.path.isdir(path):
            shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(path, target)
    os.chmod(root, 0o755)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o755)
        for name in files:
            os.chmod(os.path.join(parent, name), 0o644)


def _python_nobody_can_run(setpriv: str, root: str, env: dict[str, str]) -> str | None:
    """The first Python that user nobody can start and import the launcher with from `root`, or None.

    `-S`: nothing from a site directory (the checkout's editable install, the
    virtualenv) is seen, only the copy in `root` and Python's own library.
    """
    candidates = [
        clusterlib.PYTHON,
        getattr(sys, "_base_executable", None),
        shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}"),
        shutil.which("python3"),
        "/usr/bin/python3",
    ]
    seen = set()
    for python in candidates:
        if not python or os.path.realpath(python) in seen:
            continue
        seen.add(os.path.realpath(python))
        probe = subprocess.run(
            [*_as_nobody(setpriv), python, "-S", "-c", "import tfdist_trainer.launch.main"],
            capture_output=True,
            env=env,
            cwd=root,
            timeout=60,
        )
        if probe.returncode == 0:
            return python
    return None


def assert_names_why_netns_cannot_run(r: subprocess.CompletedProcess, uid: int) -> None:
    assert r.returncode == 2, r.stdout[-3000:]
    errors = [line for line in r.stdout.splitlines() if line.startswith("[launch] error:")]
    assert len(errors) == 1, r.stdout[-3000:]
    assert "--private_network cannot create a network namespace" in errors[0]
    assert "need root" in errors[0] and f"running as uid {uid})" in errors[0], errors[0]
    assert errors[0].endswith("."), errors[0]
    assert "Traceback" not in r.stdout


def test_private_network_names_why_it_cannot_run(tmp_path):
    """As an unprivileged user, `--private_network_via=netns` fails with one sentence and exit 2.

    Not root: the launcher runs as this user. Root: as user nobody (setpriv),
    from a world-readable copy of the packages it imports in /tmp, since
    nobody may not read the checkout (a clone under `mktemp -d`, 0700, with
    its virtualenv inside). Where nobody can start no Python at all (or there
    is no setpriv), the launcher runs as root with os.geteuid() answering
    nobody's uid: the same decision, message and exit code.
    """
    launch_args = ["--private_network", "--private_network_via=netns"]
    train_args = mnist_args(str(tmp_path / "model"))
    if os.geteuid() != 0:
        r = clusterlib.run(launch_cmd(launch_args, train_args), timeout=60)
        assert_names_why_netns_cannot_run(r, os.geteuid())
        return
    setpriv = shutil.which("setpriv")
    copy = tempfile.mkdtemp(
        prefix="tfdist-launcher-", dir="/tmp" if os.path.isdir("/tmp") else None
    )
    try:
        env = clusterlib.base_env({"PYTHONPATH": copy})
        python = None
        if setpriv:
            _readable_copy_of_launcher(copy)
            python = _python_nobody_can_run(setpriv, copy, env)
        if python:
            cmd = [
                *_as_nobody(setpriv),
                python,
                "-S",
                "-m",
                "tfdist_trainer.launch.main",
                *launch_args,
                "--",
                *train_args,
            ]
            r = clusterlib.run(cmd, env=env, cwd=copy, timeout=60)
        else:
            cmd = [clusterlib.PYTHON, "-c", _LAUNCH_AS_IF_NOBODY, *launch_args, "--", *train_args]
            r = clusterlib.run(cmd, timeout=60)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert_names_why_netns_cannot_run(r, NOBODY)
    assert not os.path.exists(tmp_path / "model")


def test_private_network_netns_needs_root_decided_in_process(monkeypatch):
    """The launcher's decision itself, for any uid but root: netns cannot be used, and why."""
    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)
    method, reason = netns.private_network_method("netns")
    assert method == "netns"
    assert reason == f"network namespaces with `ip netns` need root (running as uid {NOBODY})"


def test_private_network_refused_without_root_by_the_launcher(tmp_path):
    """The launcher, root or not, with os.geteuid() answering nobody's uid: one sentence, exit 2.

    In a child process: the launcher's absl flags cannot be defined next to
    tfdist_trainer.cli's in the test's own process.
    """
    model_dir = tmp_path / "model"
    cmd = [
        clusterlib.PYTHON,
        "-c",
        _LAUNCH_AS_IF_NOBODY,
        "--private_network",
        "--private_network_via=netns",
        "--",
        *mnist_args(str(model_dir)),
    ]
    r = clusterlib.run(cmd, timeout=60)
    assert_names_why_netns_cannot_run(r, NOBODY)
    assert not os.path.exists(model_dir)


# -- the namespace helpers -----------------------------------------------------------------


def test_namespaces_are_deleted_and_stale_ones_swept():
    reason = netns.netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    ns = netns.Namespace("unit").create()
    assert ns.name in netns.list_namespaces()
    ns.delete()
    assert ns.name not in netns.list_namespaces()
    ns.delete()  # twice is fine
    # A namespace whose creator is gone (pid 1 never ends, so fake a dead pid) is swept.
    dead_pid = 2**22 + 17
    stale = netns.Namespace(name=f"{netns.PREFIX}unit-{dead_pid}-abcdef")
    stale.create()
    try:
        assert stale.name in netns.sweep_stale()
        assert stale.name not in netns.list_namespaces()
    finally:
        stale.delete()


def test_virtual_lan_stays_inside_its_namespaces():
    """Addresses live only in the host namespaces; the machine's own namespace gains no link."""
    reason = netns.netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")
    with VirtualLan(["a", "b"], tag="unit") as lan:
        assert lan.address("b") == "10.231.0.2"
        host_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert "10.231.0." not in host_addrs
        after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count(
            "\n"
        )
        assert after == before, "the LAN added a link to the host's namespace"
        inside = subprocess.run(
            [*lan.exec_prefix("a"), "ip", "-o", "addr"], capture_output=True, text=True
        ).stdout
        assert "10.231.0.1/24" in inside
        names = [lan.switch.name, *(ns.name for ns in lan.namespaces.values())]
    assert not set(names) & set(netns.list_namespaces())


def test_bring_loopback_up_in_a_fresh_namespace():
    reason = netns.unshare_unavailable_reason()
    if reason:
        pytest.skip(reason)
    code = (
        "import socket; from tfdist_trainer.launch import netns\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "try:\n    socket.create_connection(s.getsockname(), timeout=1); print('up before')\n"
        "except OSError: pass\n"
        "netns.bring_loopback_up(); socket.create_connection(s.getsockname(), timeout=1); print('ok')\n"
    )
    r = subprocess.run(
        ["unshare", "-rn", clusterlib.PYTHON, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clusterlib.base_env(),
        timeout=60,
    )
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
