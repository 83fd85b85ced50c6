"""Many machines: one `tfdist-train` per network namespace, on a private virtual LAN.

Each task runs in its own network namespace ("host") with its own address on
10.231.0.0/24; the namespaces are joined by veth pairs to a bridge in a
"switch" namespace (tests/netlab.py, VirtualLan). Every task listens on
the same port, 2222, as on real machines, and the tasks find each other only
by those addresses. The model_dir is shared through the filesystem, as an NFS
mount or a bucket would be. Nothing of the LAN is visible from the host's
own namespace.

The partition test takes worker:1's link down in the middle of a
parameter_server run and brings it back PARTITION_S seconds later (a flapping
switch port, a rebooted top-of-rack switch): the realistic partition, and the
one a job can survive. What happens, measured on TF 2.21:

* TensorFlow's gRPC channels have no keepalive, so the coordinator does not
  notice a silent partition: the closure in flight on worker:1 simply waits
  (TCP retransmits) and the chief stalls. When the link is back, the TCP
  connection resumes, the closure completes, and training goes on; when TCP
  gave up meanwhile (it does when the chief had unacknowledged data on the
  link), the coordinator takes the killed-worker path instead: "Worker 1
  failed", the closure is put back and re-run on worker:0. Either way the run
  ends exactly at train_steps, with one chief and no restore, and worker:1
  keeps serving (its --chief_gone_grace_s is longer than the partition).
* A partition that never heals is not survivable by waiting: with no data in
  flight nothing ever times out and the chief waits forever, even after the
  cut-off worker exits. BUILD.md (Troubleshooting) says what to do; the
  killed-worker tests in test_durability.py cover the recovery.

Needs root and iproute2 (`ip netns`); each test skips with the reason when
either is missing or namespaces are not permitted (e.g. in a container
without CAP_SYS_ADMIN).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import clusterlib
import pytest
import tensorflow as tf
from clusterlib import REPO, HandCluster, chief_gone_grace, mnist_args, read_records
from netlab import VirtualLan

from tfdist_trainer.launch import netns

PORT = 2222
STEPS = 150
TIMEOUT_S = 300
MIN_EVAL_ACCURACY = 0.6  # 150 steps on the digits set reach ~0.9; chance is 0.1

PARTITION_STEPS = 300  # long enough that the partition lands mid-run on a busy 2-core machine
PARTITION_AT_STEP = 60
PARTITION_S = 6


def _skip_reason() -> str | None:
    return netns.netns_unavailable_reason()


@pytest.fixture
def make_lan():
    """Creates VirtualLans; a finalizer kills what runs inside and deletes every namespace."""
    reason = _skip_reason()
    if reason:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")
    netns.sweep_stale()
    made: list[VirtualLan] = []

    def make(hosts: list[str]) -> VirtualLan:
        lan = VirtualLan(hosts, tag="mh")
        made.append(lan)
        return lan.create()

    yield make
    for lan in made:
        lan.close()
    left = [
        n
        for lan in made
        for n in [lan.switch.name, *(ns.name for ns in lan.namespaces.values())]
        if n in netns.list_namespaces()
    ]
    assert left == [], f"namespaces left behind: {left}"


class LanCluster(HandCluster):
    """One `ip netns exec <host> python -m tfdist_trainer.cli ...` per task, each on its own host."""

    def __init__(self, lan: VirtualLan, layout: dict[str, int], train_args, log_dir, **kwargs):
        self.lan = lan
        self.host_of = {f"{t}:{i}": f"{t}{i}" for t, n in layout.items() for i in range(n)}
        cluster = {
            t: [f"{lan.address(f'{t}{i}')}:{PORT}" for i in range(n)] for t, n in layout.items()
        }
        super().__init__(cluster, train_args, log_dir, **kwargs)

    def start(self, task_type: str, index: int) -> subprocess.Popen:
        role = f"{task_type}:{index}"
        args, env = self._args_for(task_type, index)
        log = open(os.path.join(self.log_dir, f"{task_type}-{index}.log"), "w")  # noqa: SIM115 (lives as long as the task)
        cmd = [*self.lan.exec_prefix(self.host_of[role]), *clusterlib.train_cmd(*args)]
        proc = subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[role] = proc
        return proc


def hosts_of(layout: dict[str, int]) -> list[str]:
    return [f"{t}{i}" for t, n in layout.items() for i in range(n)]


def assert_finished(model_dir: str, steps: int, context: str) -> list[dict]:
    records = read_records(model_dir)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert train, f"no train records in {model_dir}\n{context[-6000:]}"
    train_steps = [r["step"] for r in train]
    assert train_steps == sorted(set(train_steps)), (
        f"one writer, steps strictly increasing: {train_steps}"
    )
    assert train_steps[-1] == steps, (
        f"last train record at {train_steps[-1]}, want {steps}\n{context[-4000:]}"
    )
    assert train[0]["loss"] > train[-1]["loss"], [r["loss"] for r in train]
    assert evals and evals[-1]["step"] == steps, evals
    assert evals[-1]["eval_accuracy"] > MIN_EVAL_ACCURACY, evals[-1]
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest is not None and latest.endswith(f"ckpt-{steps}"), latest
    assert clusterlib.no_process_left(model_dir) == []
    return train


def run_lan_cluster(
    make_lan, tmp_path, strategy: str, layout: dict[str, int], *, use_flags: bool
) -> str:
    lan = make_lan(hosts_of(layout))
    model_dir = str(tmp_path / "model")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    hand = LanCluster(
        lan,
        layout,
        mnist_args(strategy, model_dir, STEPS),
        str(log_dir),
        per_task_args=chief_gone_grace(strategy, 5),
        use_flags=use_flags,
    )
    codes = hand.run_all(timeout=TIMEOUT_S)
    logs = hand.logs()
    assert codes == {role: 0 for role in hand.procs}, f"exit codes {codes}\n{logs}"
    assert_finished(model_dir, STEPS, logs)
    # The tasks really talked over the LAN: the cluster they report names the namespace addresses.
    every_log = "\n".join(hand.log(role) for role in hand.procs)
    assert "127.0.0.1" not in every_log, "a task used loopback instead of the LAN"
    return every_log


@pytest.mark.cluster
def test_parameter_server_across_four_hosts(make_lan, tmp_path):
    """chief, 2 workers and 1 ps, each in its own namespace, started with the classic flags."""
    logs = run_lan_cluster(
        make_lan, tmp_path, "parameter_server", {"chief": 1, "worker": 2, "ps": 1}, use_flags=True
    )
    assert "strategy parameter_server with 1 replica(s) in sync" in logs


@pytest.mark.cluster
def test_multi_worker_mirrored_across_two_hosts(make_lan, tmp_path):
    """2 synchronous workers in two namespaces, each with its own TF_CONFIG."""
    logs = run_lan_cluster(
        make_lan, tmp_path, "multi_worker_mirrored", {"worker": 2}, use_flags=False
    )
    assert "strategy multi_worker_mirrored with 2 replica(s) in sync" in logs


def partitionable_pss(
    make_lan, tmp_path, grace_s: float, *extra: str
) -> tuple[VirtualLan, LanCluster]:
    """A parameter_server job of PARTITION_STEPS on four hosts (chief, 2 workers, a ps), not yet
    started, whose links the test can cut. Its serving tasks wait `grace_s` for a chief they cannot
    reach, so the cut (or the chief's restart) a test makes must fit in it. Model in
    tmp_path/model, logs in tmp_path/logs."""
    layout = {"chief": 1, "worker": 2, "ps": 1}
    lan = make_lan(hosts_of(layout))
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    args = mnist_args("parameter_server", str(tmp_path / "model"), PARTITION_STEPS, *extra)
    hand = LanCluster(
        lan, layout, args, str(log_dir), per_task_args=chief_gone_grace("parameter_server", grace_s)
    )
    return lan, hand


@pytest.mark.cluster
def test_parameter_server_survives_a_partitioned_worker(make_lan, tmp_path):
    """worker:1's link goes down mid-run for PARTITION_S seconds; the run ends exactly at train_steps,
    without a restart or a restore."""
    model_dir = str(tmp_path / "model")
    lan, hand = partitionable_pss(
        make_lan, tmp_path, 30, "--gin_bindings=train.log_every_n_steps=20"
    )
    try:
        hand.start_all()
        cut_at = hand.wait_for_train_step(model_dir, PARTITION_AT_STEP, TIMEOUT_S)
        lan.set_link("worker1", up=False)
        time.sleep(PARTITION_S)
        healed_at = time.time()
        lan.set_link("worker1", up=True)
        codes = hand.wait_all(timeout=TIMEOUT_S)
    finally:
        hand.kill_all()
    logs = hand.logs()
    assert codes == {role: 0 for role in hand.procs}, f"exit codes {codes}\n{logs}"
    train = assert_finished(model_dir, PARTITION_STEPS, logs)
    before = [r for r in train if r["time"] <= cut_at]
    after = [r for r in train if r["time"] > healed_at]
    assert before and before[-1]["step"] < PARTITION_STEPS, (
        "the partition came after training ended"
    )
    assert after, f"no progress after the link came back: {[(r['step'], r['time']) for r in train]}"
    chief_log = hand.log("chief:0")
    assert "restored" not in chief_log, (
        "the chief restarted although only a worker's link went down"
    )
    assert f"training done at step {PARTITION_STEPS}" in chief_log
    assert "the chief marked training done" in hand.log("worker:1"), (
        "worker:1 did not serve to the end"
    )
    resumed = next(r for r in train if r["time"] > cut_at and r["step"] > before[-1]["step"])
    how = (
        "the coordinator re-ran worker:1's closure on worker:0"
        if "Putting back a closure" in chief_log
        else "the coordinator waited for the link (no failure detected)"
    )
    print(
        f"\n[multihost] worker:1 cut off at step {before[-1]['step']} for {PARTITION_S}s; next record "
        f"{resumed['time'] - cut_at:.1f}s after the cut; {how}"
    )


STALL_TIMEOUT_S = 20


@pytest.mark.cluster
def test_parameter_server_watchdog_ends_a_stall_and_a_restart_resumes(make_lan, tmp_path):
    """worker:1's link stays down past parameter_server.stall_timeout_s: the chief names worker:1, saves a
    checkpoint and exits 200 (retryable) instead of waiting forever; chief and ps restarted (what a
    restart policy does) resume from that checkpoint and end exactly at train_steps."""
    model_dir, log_dir = str(tmp_path / "model"), tmp_path / "logs"
    lan, hand = partitionable_pss(
        make_lan,
        tmp_path,
        120,
        "--gin_bindings=train.log_every_n_steps=20",
        "--gin_bindings=train.checkpoint_every_n_steps=40",
        f"--gin_bindings=parameter_server.stall_timeout_s={STALL_TIMEOUT_S}",
    )
    try:
        hand.start_all()
        hand.wait_for_train_step(model_dir, PARTITION_AT_STEP, TIMEOUT_S)
        lan.set_link("worker1", up=False)
        cut_at = time.time()
        chief_code = hand.wait("chief:0", timeout=STALL_TIMEOUT_S + 120)
        stalled_s = time.time() - cut_at
        first_log = hand.log("chief:0")
        lan.set_link("worker1", up=True)
        # What the launcher's restart group for a failed chief does: chief and ps start again.
        os.rename(log_dir / "chief-0.log", log_dir / "chief-0.first.log")
        hand.procs["ps:0"].kill()
        hand.procs["ps:0"].wait()
        hand.start("ps", 0)
        hand.start("chief", 0)
        restarted_at = time.time()
        codes = hand.wait_all(timeout=TIMEOUT_S)
    finally:
        hand.kill_all()
    logs = hand.logs()
    assert chief_code == 200, (
        f"the stalled chief exited {chief_code}, want 200\n{first_log[-5000:]}"
    )
    # The chief's saves go through one traced function that needs only the chief and the ps (made at
    # the first periodic save, before the cut): it saves what the finished loops counted.
    found = re.search(
        rf"error: no scheduled step loop finished for {STALL_TIMEOUT_S}s; silent: worker:1 "
        rf"\(10\.231\.0\.\d+:{PORT}\).*; (saved a checkpoint at step (\d+)); exiting with code 200 "
        rf"\(retryable\)",
        first_log,
    )
    assert found, first_log[-5000:]
    assert codes == {role: 0 for role in hand.procs}, f"exit codes {codes}\n{logs}"
    restored = [int(s) for s in re.findall(r"restored \S+ \(step (\d+)\)", hand.log("chief:0"))]
    assert restored == [int(found.group(2))], (
        f"the restarted chief did not resume from the stall's save: {restored}"
    )
    records = read_records(model_dir)
    last_before = max(r["step"] for r in records if r["kind"] == "train" and r["time"] <= cut_at)
    assert restored[0] >= last_before, f"resumed from {restored[0]}, before step {last_before}"
    train = [r for r in records if r["kind"] == "train" and r["time"] > restarted_at]
    assert train and train[-1]["step"] == PARTITION_STEPS, train
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest is not None and latest.endswith(f"ckpt-{PARTITION_STEPS}"), latest
    print(
        f"\n[multihost] worker:1 partitioned at step {last_before}; the chief gave up after {stalled_s:.1f}s "
        f"(stall_timeout_s={STALL_TIMEOUT_S}): {found.group(1)}; restarted chief resumed from step "
        f"{restored[0]} (steps lost {max(0, last_before - restored[0])}); first record "
        f"{train[0]['time'] - restarted_at:.1f}s after the restart"
    )
