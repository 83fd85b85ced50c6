"""Unit tests of tfdist_trainer.plan.cluster: parsing, roles, conversions and the pre-TF network checks.

Nothing here imports TensorFlow; the network checks use real sockets on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tfdist_trainer.launch.local_tasks import free_port_cluster
from tfdist_trainer.launch.ports import pick_port
from tfdist_trainer.plan import cluster as cluster_lib
from tfdist_trainer.plan import network
from tfdist_trainer.plan.cluster import (
    ClusterConfig,
    ClusterConfigError,
    TaskAddress,
    from_flags,
    from_tf_config,
    resolve,
)
from tfdist_trainer.plan.network import (
    PortHolder,
    check_own_port,
    is_listening,
    port_is_free,
    wait_for_tasks,
)

CLUSTER = {
    "chief": ["host0:2222"],
    "worker": ["host1:2222", "host2:2222"],
    "ps": ["host3:2222"],
}


def _tf_config(cluster, task_type, index, **extra) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


# -- TF_CONFIG ------------------------------------------------------------------


def test_tf_config_basic():
    config = from_tf_config(_tf_config(CLUSTER, "worker", 1))
    assert config.task_type == "worker" and config.task_id == 1
    assert config.cluster == {t: tuple(a) for t, a in CLUSTER.items()}
    assert config.role == "worker:1"
    assert config.own_address == TaskAddress("worker", 1, "host2:2222")
    assert config.own_address.host == "host2" and config.own_address.port == 2222
    assert config.num_tasks("worker") == 2 and config.num_tasks("evaluator") == 0
    assert config.rpc_layer == "grpc" and config.environment is None


def test_tf_config_kubeflow_tfjob_form():
    """What a Kubeflow TFJob injects: upper/mixed-case types, environment cloud, an evaluator, 'master'."""
    text = json.dumps(
        {
            "cluster": {
                "Master": ["tfjob-master-0.ns.svc:2222"],
                "WORKER": ["tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"],
                "ps": ["tfjob-ps-0.ns.svc:2222"],
                "evaluator": ["tfjob-evaluator-0.ns.svc:2222"],
            },
            "task": {"type": "Worker", "index": "1"},
            "environment": "cloud",
        }
    )
    config = from_tf_config(text)
    assert set(config.cluster) == {"chief", "worker", "ps", "evaluator"}
    assert config.task_type == "worker" and config.task_id == 1
    assert config.environment == "cloud"
    assert not config.is_chief
    master = from_tf_config(
        text.replace('"type": "Worker", "index": "1"', '"type": "master", "index": 0')
    )
    assert master.task_type == "chief" and master.is_chief and master.role == "chief:0"


def test_tf_config_single_address_string_and_ipv6():
    config = from_tf_config(_tf_config({"worker": "[::1]:2222"}, "worker", 0))
    assert config.cluster == {"worker": ("[::1]:2222",)}
    assert config.own_address.host == "::1" and config.own_address.port == 2222


def test_empty_tf_config_is_a_lone_process():
    config = resolve({})
    assert config.is_local and config.is_chief and config.role == "local"
    assert config.own_address is None and config.to_tf_config() == ""
    assert resolve({"TF_CONFIG": "   "}).is_local


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", ["not valid JSON", "TF_CONFIG"]),
        ("[1, 2]", ["JSON object"]),
        ('{"cluster": ["h:1"], "task": {}}', ["'cluster' must be an object"]),
        ('{"cluster": {"worker": ["h:1"]}, "task": "worker"}', ["'task' must be an object"]),
        (_tf_config(CLUSTER, "ps", 1), ["index 1", "out of range", "'ps'", "valid: 0..0"]),
        (_tf_config(CLUSTER, "worker", -1), ["index -1", "out of range"]),
        (_tf_config(CLUSTER, "worker", "one"), ["must be an integer"]),
        (_tf_config(CLUSTER, "worker", True), ["must be an integer"]),
        (
            _tf_config({"worker": ["h:1"]}, "ps", 0),
            ["'ps' is not in the cluster", "which has worker"],
        ),
        (_tf_config({"worker": ["h:1"]}, "trainer", 0), ["unknown task type 'trainer'"]),
        (_tf_config({"boss": ["h:1"]}, "boss", 0), ["unknown task type 'boss'"]),
        (_tf_config({"worker": ["h:1"]}, None, 0), ["type is not", "task.type"]),
        (_tf_config({}, "worker", 0), ["cluster is empty"]),
        (_tf_config({"worker": []}, "worker", 0), ["non-empty list"]),
        (_tf_config({"worker": ["hostonly"]}, "worker", 0), ["'hostonly'", "host:port"]),
        (_tf_config({"worker": ["h:99999"]}, "worker", 0), ["'h:99999'", "1..65535"]),
        (_tf_config({"worker": ["h:1", "h:1"]}, "worker", 0), ["worker:1 and worker:0", "h:1"]),
        (
            _tf_config({"chief": ["h:1", "h:2"], "worker": ["h:3"]}, "chief", 0),
            ["exactly one chief"],
        ),
        (
            _tf_config({"chief": ["h:1"], "evaluator": ["h:2", "h:3"]}, "evaluator", 1),
            ["at most one evaluator, got 2", "'evaluator'"],
        ),
        (_tf_config({"worker": ["h:1"]}, "worker", 0, rpc_layer="http"), ["rpc_layer 'http'"]),
    ],
)
def test_bad_tf_config_is_one_sentence(text, words):
    with pytest.raises(ClusterConfigError) as info:
        from_tf_config(text)
    message = str(info.value)
    assert "\n" not in message and message.endswith(".")
    for word in words:
        assert word in message, message


# -- classic flags ------------------------------------------------------------------


@pytest.mark.parametrize(
    "task_type, index", [("chief", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)]
)
def test_flags_equal_tf_config(task_type, index):
    cluster = dict(CLUSTER, evaluator=["host4:2222"])
    by_flags = resolve(
        {},
        job_name=task_type,
        task_index=index,
        ps_hosts=["host3:2222"],
        worker_hosts=["host1:2222", "host2:2222"],
        chief_host="host0:2222",
        evaluator_host="host4:2222",
    )
    by_tf_config = resolve({"TF_CONFIG": _tf_config(cluster, task_type, index)})
    assert by_flags == by_tf_config
    assert by_flags.to_tf_config() == by_tf_config.to_tf_config()


def test_flags_accept_comma_separated_strings_and_win_over_tf_config():
    environ = {"TF_CONFIG": _tf_config({"worker": ["other:1"]}, "worker", 0)}
    config = resolve(
        environ,
        job_name="worker",
        task_index=1,
        ps_hosts="h:1",
        worker_hosts="h:2, h:3",
        chief_host=None,
        evaluator_host=None,
    )
    assert config.cluster == {"worker": ("h:2", "h:3"), "ps": ("h:1",)}
    assert config.role == "worker:1"
    assert config == from_flags(
        job_name="worker", task_index=1, ps_hosts=["h:1"], worker_hosts=["h:2", "h:3"]
    )


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(job_name=None, worker_hosts=["h:1"]), ["--job_name is not"]),
        (
            dict(job_name="worker", task_index=2, worker_hosts=["h:1", "h:2"]),
            ["cluster flags", "index 2", "out of range"],
        ),
        (
            dict(job_name="ps", task_index=0, worker_hosts=["h:1"]),
            ["cluster flags", "'ps' is not in the cluster"],
        ),
        (dict(job_name="worker", task_index=0), ["cluster is empty"]),
    ],
)
def test_bad_flags_are_one_sentence(kwargs, words):
    with pytest.raises(ClusterConfigError) as info:
        resolve({}, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


# -- conversions and roles ---------------------------------------------------------


def test_to_tf_config_removes_the_evaluator_for_trainers_only():
    cluster = dict(CLUSTER, evaluator=["host4:2222"])
    for task_type in ("chief", "worker", "ps"):
        out = json.loads(
            from_tf_config(_tf_config(cluster, task_type, 0, environment="cloud")).to_tf_config()
        )
        assert "evaluator" not in out["cluster"]
        assert out["cluster"] == CLUSTER
        assert out["task"] == {"type": task_type, "index": 0}
        assert out["environment"] == "cloud" and out["rpc_layer"] == "grpc"
    evaluator = json.loads(from_tf_config(_tf_config(cluster, "evaluator", 0)).to_tf_config())
    assert evaluator["cluster"]["evaluator"] == ["host4:2222"]
    assert evaluator["task"] == {"type": "evaluator", "index": 0}
    assert "environment" not in evaluator


def test_tf_config_text_is_the_one_writer_launcher_and_kubernetes_forms():
    cluster = dict(CLUSTER, evaluator=["host4:2222"])
    # tfdist-launch's form: the evaluator stays in the cluster, as Kubeflow writes it.
    text = cluster_lib.tf_config_text(cluster, "worker", 1)
    assert json.loads(text) == {"cluster": cluster, "task": {"type": "worker", "index": 1}}
    parsed = from_tf_config(text)
    assert (parsed.task_type, parsed.task_id, parsed.num_tasks("evaluator")) == ("worker", 1, 1)
    assert json.loads(parsed.to_tf_config())["cluster"] == CLUSTER
    # The Kubernetes form: an index Kubernetes expands later, written where the number goes.
    template = cluster_lib.tf_config_text(CLUSTER, "ps", "$(TASK_INDEX)")
    assert '"index": $(TASK_INDEX)}' in template
    assert json.loads(template.replace("$(TASK_INDEX)", "0"))["task"] == {"type": "ps", "index": 0}


def test_to_tf_config_normalizes_master_to_chief():
    config = from_tf_config(_tf_config({"MASTER": ["h:1"], "worker": ["h:2"]}, "MASTER", 0))
    out = json.loads(config.to_tf_config())
    assert out["cluster"] == {"chief": ["h:1"], "worker": ["h:2"]}
    assert out["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize(
    "cluster, task_type, index, chief",
    [
        (CLUSTER, "chief", 0, True),
        (CLUSTER, "worker", 0, False),  # a chief exists, so worker:0 is not the chief
        (CLUSTER, "ps", 0, False),
        ({"worker": ["h:1", "h:2"]}, "worker", 0, True),  # no chief: worker:0 is (TF's rule)
        ({"worker": ["h:1", "h:2"]}, "worker", 1, False),
        ({"worker": ["h:1"], "evaluator": ["h:2"]}, "evaluator", 0, False),
        (dict(CLUSTER, evaluator=["h:9"]), "evaluator", 0, False),
    ],
)
def test_is_chief(cluster, task_type, index, chief):
    assert from_tf_config(_tf_config(cluster, task_type, index)).is_chief is chief


def test_training_cluster_and_tasks():
    config = from_tf_config(_tf_config(dict(CLUSTER, evaluator=["host4:2222"]), "chief", 0))
    assert "evaluator" not in config.training_cluster()
    assert [t.name for t in config.tasks(("worker", "ps"))] == ["worker:0", "worker:1", "ps:0"]
    assert [t.name for t in config.tasks()][-1] == "evaluator:0"


# -- the network ---------------------------------------------------------------------


def _listening_socket(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


def _local_config(task_type: str = "worker", index: int = 0, n: int = 2) -> ClusterConfig:
    ports = [pick_port() for _ in range(n)]
    return from_tf_config(
        _tf_config({"worker": [f"127.0.0.1:{p}" for p in ports]}, task_type, index)
    )


def test_port_is_free_and_check_own_port():
    config = _local_config(index=1)
    port = config.own_address.port
    assert port_is_free(port)
    check_own_port(config)  # free: no error
    check_own_port(resolve({}))  # a lone process has no port
    held = _listening_socket(port)
    try:
        assert not port_is_free(port)
        with pytest.raises(ClusterConfigError) as info:
            check_own_port(config)
        message = str(info.value)
        assert f"port {port}" in message and "worker:1" in message and "already in use" in message
        check_own_port(_local_config(index=0))  # another task's port is not ours to check
    finally:
        held.close()
    assert port_is_free(port)


def test_wait_for_tasks_names_only_the_missing_tasks():
    config = _local_config(n=3)
    up, down_1, down_2 = config.tasks()
    held = _listening_socket(up.port)
    try:
        wait_for_tasks([up], timeout_s=2, poll_s=0.05)  # returns at once
        started = time.monotonic()
        with pytest.raises(ClusterConfigError) as info:
            wait_for_tasks(
                [up, down_1, down_2],
                timeout_s=0.5,
                poll_s=0.05,
                waiting_for=" (waited for by chief:0)",
            )
        assert time.monotonic() - started < 5
    finally:
        held.close()
    message = str(info.value)
    assert f"worker:1 at {down_1.address}" in message and f"worker:2 at {down_2.address}" in message
    assert "worker:0" not in message
    assert (
        "0.5s" in message
        and "(waited for by chief:0)" in message
        and "start those tasks" in message
    )
    assert "\n" not in message
    with pytest.raises(ClusterConfigError, match="start that task"):
        wait_for_tasks([down_1], timeout_s=0.2, poll_s=0.05)


def test_wait_for_tasks_sees_a_task_that_comes_up_late():
    config = _local_config(n=1)
    task = config.tasks()[0]
    holder = None

    def start_later():
        nonlocal holder
        time.sleep(0.5)
        holder = PortHolder(task.port)

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        wait_for_tasks([task], timeout_s=10, poll_s=0.05)
    finally:
        thread.join()
        holder.close()


def test_port_holder_listens_until_closed():
    port = pick_port()
    address = TaskAddress("worker", 0, f"127.0.0.1:{port}")
    assert not is_listening(address, timeout=0.2)
    holder = PortHolder(port)
    try:
        assert is_listening(address, timeout=1)
        assert is_listening(address, timeout=1)  # accepts again after the first connection
        assert not port_is_free(port)
    finally:
        holder.close()
    assert not is_listening(address, timeout=0.2)
    assert port_is_free(port)  # TF can take the port right after


def test_set_grpc_environment_keeps_a_user_setting():
    environ: dict = {}
    network.set_grpc_environment(environ)
    assert environ == {"GRPC_FAIL_FAST": "use_caller"}
    environ = {"GRPC_FAIL_FAST": "false"}
    network.set_grpc_environment(environ)
    assert environ == {"GRPC_FAIL_FAST": "false"}


def test_local_cluster_ports_are_free_and_outside_the_kernels_ephemeral_range():
    """An outgoing connection can never take a port the launcher gave a task before it binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    cluster = free_port_cluster({"chief": 1, "worker": 3, "ps": 2}, second_port=("worker",))
    ports = [int(a.rsplit(":", 1)[1]) for addresses in cluster.values() for a in addresses]
    worker_ports = [int(a.rsplit(":", 1)[1]) for a in cluster["worker"]]
    every_port = ports + [p + 1 for p in worker_ports]  # each worker's tf.data port
    assert len(set(every_port)) == len(every_port) == 6 + 3
    assert all(not low <= p <= high for p in every_port), (every_port, low, high)
    assert all(port_is_free(p) for p in every_port)


def test_a_probe_that_connects_to_itself_is_not_a_listener(monkeypatch):
    """TCP simultaneous open: a probe given the probed port as its source sees itself, not a peer."""
    port = pick_port()
    own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.bind(("127.0.0.1", port))

    def connect_from_the_probed_port(address, timeout=None):
        own.settimeout(timeout)
        own.connect(address)  # nothing listens: Linux connects the socket to itself
        return own

    monkeypatch.setattr(network.socket, "create_connection", connect_from_the_probed_port)
    assert not is_listening(TaskAddress("worker", 0, f"127.0.0.1:{port}"), timeout=1)
