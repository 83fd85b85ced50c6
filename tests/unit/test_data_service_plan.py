"""parameter_server.data_service as planned before TensorFlow starts: the dispatcher task, the
clusters it is valid in, the local ports, and the Kubernetes objects of every flavor that can
express it (validated against the real schemas, as tests/unit/test_k8s_schemas.py does)."""

from __future__ import annotations

import itertools
import json

import gin
import pytest
import yaml
from k8s_validate import validate
from test_k8s_manifests import TRAIN_ARGS, by_kind, expand

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.launch import k8s
from tfdist_trainer.launch.local_tasks import free_port_cluster, plan_tasks
from tfdist_trainer.plan import cluster as cluster_lib
from tfdist_trainer.plan import strategies
from tfdist_trainer.plan.cluster import ClusterConfig, ClusterConfigError
from tfdist_trainer.plan.task_layout import task_layout

SERVED = strategies.ParameterServer(data_service=True)


def cluster_of(layout: dict[str, int], task_type: str = "chief", index: int = 0) -> ClusterConfig:
    addresses = {t: tuple(f"{t}-{i}:2222" for i in range(n)) for t, n in layout.items()}
    return ClusterConfig(cluster=addresses, task_type=task_type, task_id=index)


def test_the_layout_gains_one_dispatcher_only_with_data_service():
    layout = task_layout(SERVED, num_workers=2, num_ps=1, evaluator=True)
    assert layout == {"chief": 1, "worker": 2, "ps": 1, "dispatcher": 1, "evaluator": 1}
    plain = task_layout(strategies.ParameterServer(), num_workers=2, num_ps=1, evaluator=False)
    assert "dispatcher" not in plain


def test_the_dispatcher_serves_and_workers_must_come_back():
    assert SERVED.serves("dispatcher") and SERVED.survives_loss_of("dispatcher")
    assert SERVED.must_come_back("worker") and not SERVED.must_come_back("ps")
    assert not strategies.ParameterServer().must_come_back("worker")
    assert SERVED.restart_group("dispatcher:0", ["chief:0", "ps:0", "dispatcher:0"]) == [
        "dispatcher:0"
    ]
    chief = cluster_of({"chief": 1, "worker": 2, "ps": 1, "dispatcher": 1})
    assert [t.name for t in SERVED.peers(chief)] == [
        "worker:0",
        "worker:1",
        "ps:0",
        "dispatcher:0",
    ]


def test_the_dispatcher_is_no_task_of_tensorflow_s_cluster():
    layout = {"chief": 1, "worker": 2, "ps": 1, "dispatcher": 1}
    dispatcher = cluster_of(layout, "dispatcher")
    assert dispatcher.to_tf_config() == ""
    chief = cluster_of(layout)
    assert "dispatcher" not in json.loads(chief.to_tf_config())["cluster"]
    assert chief.dispatcher_address == "dispatcher-0:2222"
    assert chief.data_worker_address is None
    assert cluster_of(layout, "worker", 1).data_worker_address == "worker-1:2223"


@pytest.mark.parametrize(
    "strategy, layout, message",
    [
        (
            SERVED,
            {"chief": 1, "worker": 1, "ps": 1},
            "parameter_server.data_service=True needs a tf.data dispatcher task but the cluster "
            "has none",
        ),
        (
            strategies.ParameterServer(),
            {"chief": 1, "worker": 1, "ps": 1, "dispatcher": 1},
            "the cluster has a tf.data dispatcher task, which only parameter_server.data_service=True uses",
        ),
        (
            strategies.MultiWorkerMirrored(),
            {"worker": 2, "dispatcher": 1},
            "the cluster has a tf.data dispatcher task, which only parameter_server.data_service=True uses",
        ),
        (
            strategies.OneDevice(),
            {"chief": 1, "dispatcher": 1},
            "the cluster has a tf.data dispatcher task",
        ),
    ],
)
def test_a_dispatcher_where_it_does_not_belong_or_missing_is_one_sentence(
    strategy, layout, message
):
    with pytest.raises(ClusterConfigError, match=message.replace(".", r"\.")):
        strategy.validate(cluster_of(layout))


def test_two_dispatchers_are_refused():
    text = json.dumps(
        {
            "cluster": {
                "chief": ["a:1"],
                "worker": ["b:1"],
                "ps": ["c:1"],
                "dispatcher": ["d:1", "e:1"],
            },
            "task": {"type": "chief", "index": 0},
        }
    )
    with pytest.raises(ClusterConfigError, match="a cluster has at most one dispatcher, got 2"):
        cluster_lib.from_tf_config(text)


def test_classic_flags_name_the_dispatcher():
    config = cluster_lib.from_flags(
        job_name="worker",
        task_index=0,
        chief_host="h0:2000",
        worker_hosts="h1:2000",
        ps_hosts="h2:2000",
        dispatcher_host="h3:2000",
    )
    assert config.dispatcher_address == "h3:2000"
    assert config.data_worker_address == "h1:2001"


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_data_service_must_be_a_bool(value):
    with pytest.raises(ConfigError, match="parameter_server.data_service must be True or False"):
        strategies.ParameterServer(data_service=value)


def test_gin_turns_it_on():
    gin.clear_config()
    try:
        gin.parse_config("parameter_server.data_service = True")
        assert strategies.ParameterServer().data_service is True
    finally:
        gin.clear_config()


def test_local_workers_get_their_data_port_free_and_unshared():
    for _ in range(5):
        cluster = free_port_cluster({"chief": 1, "worker": 3, "ps": 1}, second_port=("worker",))
        ports = [int(a.rsplit(":", 1)[1]) for addresses in cluster.values() for a in addresses]
        data_ports = [int(a.rsplit(":", 1)[1]) + 1 for a in cluster["worker"]]
        assert len(set(ports + data_ports)) == len(ports) + len(data_ports)
    tasks, planned = plan_tasks(SERVED, num_workers=2, num_ps=1, evaluator=False, host="127.0.0.1")
    assert [t.role for t in tasks if t.task_type == "dispatcher"] == ["dispatcher:0"]
    assert not next(t for t in tasks if t.task_type == "dispatcher").drives


def manifests(flavor: str, **settings) -> list[dict]:
    defaults = dict(
        name="mnist",
        image="registry.example/trainer:1",
        train_args=TRAIN_ARGS,
        num_workers=2,
        num_ps=1,
    )
    return k8s.manifests(
        k8s.JobSpec(strategy_config=SERVED, flavor=flavor, **{**defaults, **settings})
    )


@pytest.mark.parametrize(
    "flavor, evaluator, restart_policy",
    list(
        itertools.product(
            [f for f in k8s.FLAVORS if f != "tfjob"], (False, True), ("Never", "OnFailure")
        )
    ),
)
def test_the_flavors_that_can_emit_the_dispatcher_do_so_validly(flavor, evaluator, restart_policy):
    objects = list(
        yaml.safe_load_all(
            k8s.to_yaml(manifests(flavor, evaluator=evaluator, restart_policy=restart_policy))
        )
    )
    assert [e for o in objects for e in validate(o)] == []
    text = json.dumps(objects)
    assert "dispatcher" in text
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [2222, 2223]
    # every task's TF_CONFIG names the dispatcher
    configs = [
        json.loads(expand(env["value"], {"JOB_COMPLETION_INDEX": "0", "TASK_INDEX": "0"}))
        for env in _env_values(objects, "TF_CONFIG")
    ]
    assert configs and all("dispatcher" in c["cluster"] for c in configs)


def _env_values(node, name: str) -> list[dict]:
    found = []
    if isinstance(node, dict):
        if node.get("name") == name and "value" in node:
            found.append(node)
        for value in node.values():
            found.extend(_env_values(value, name))
    elif isinstance(node, list):
        for value in node:
            found.extend(_env_values(value, name))
    return found


def test_the_jobset_starts_the_chief_after_the_dispatcher():
    (jobset,) = by_kind(manifests("jobset"), "JobSet")
    jobs = {j["name"]: j for j in jobset["spec"]["replicatedJobs"]}
    assert list(jobs) == ["ps", "dispatcher", "worker", "chief"]
    assert {d["name"] for d in jobs["chief"]["dependsOn"]} == {"ps", "dispatcher", "worker"}
    assert "dispatcher" not in jobset["spec"]["successPolicy"]["targetReplicatedJobs"]


def test_a_tfjob_cannot_express_the_dispatcher():
    with pytest.raises(
        k8s.ManifestError, match="a TFJob .* has no replica type for the dispatcher"
    ):
        manifests("tfjob")
