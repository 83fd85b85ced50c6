"""Kubernetes manifests (tfdist_trainer.launch.k8s), built in process and checked by parsing them back.

The strategy decides the replica types exactly as for a local launch; every
pod runs the same `tfdist-train` command; the indexed flavor's TF_CONFIG,
once Kubernetes has expanded $(TASK_INDEX), is a cluster that tfdist-train
accepts and whose own address is the pod's DNS name; the NetworkPolicy admits
only pods of the same job. The YAML is written with PyYAML (a runtime
dependency of the package) and read back with it. The command line
(`tfdist-launch --emit=k8s`) is tested in tests/test_k8s.py.
"""

from __future__ import annotations

import json
import os

import pytest
import tomllib
import yaml
from clusterlib import REPO

from tfdist_trainer.launch import k8s
from tfdist_trainer.plan import cluster as cluster_lib
from tfdist_trainer.plan import strategies

TRAIN_ARGS = [
    "--gin_file=configs/mnist.gin",
    "--gin_file=configs/strategies/parameter_server.gin",
    "--gin_bindings=MnistTrainer.filters=(8, 16)",
    "--model_dir=gs://bucket/run1",
]


#: Every strategy with its defaults: the manifests of each one are checked.
STRATEGIES = {name: strategies.config_class(name)() for name in strategies.NAMES}


def manifest_settings(strategy: str, **kwargs) -> dict:
    """k8s.JobSpec's settings for a 2-worker, 1-ps job of `strategy`, with `kwargs` on top."""
    settings = dict(
        strategy_config=STRATEGIES[strategy],
        name="mnist",
        image="registry.example/trainer:1",
        train_args=TRAIN_ARGS,
        num_workers=2,
        num_ps=1,
    )
    settings.update(kwargs)
    return settings


def build(strategy: str, **kwargs) -> list[dict]:
    objects = k8s.manifests(k8s.JobSpec(**manifest_settings(strategy, **kwargs)))
    parsed = list(yaml.safe_load_all(k8s.to_yaml(objects)))
    assert parsed == objects, "the YAML does not read back as the objects it was written from"
    assert json.loads(k8s.to_json(objects))["items"] == objects
    return parsed


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def pod_templates(objects: list[dict]) -> dict[str, dict]:
    """task type -> pod template, for either flavor."""
    templates = {}
    for obj in objects:
        if obj["kind"] == "TFJob":
            for replica_type, spec in obj["spec"]["tfReplicaSpecs"].items():
                templates[replica_type.lower()] = spec["template"]
        elif obj["kind"] == "Job":
            templates[obj["metadata"]["labels"][k8s.TYPE_LABEL]] = obj["spec"]["template"]
        elif obj["kind"] == "JobSet":
            for replicated in obj["spec"]["replicatedJobs"]:
                templates[replicated["name"]] = replicated["template"]["spec"]["template"]
    return templates


def container(template: dict) -> dict:
    (only,) = template["spec"]["containers"]
    return only


@pytest.mark.parametrize(
    "strategy, evaluator, replicas",
    [
        ("parameter_server", True, {"Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1}),
        ("parameter_server", False, {"Chief": 1, "Worker": 2, "PS": 1}),
        ("multi_worker_mirrored", False, {"Worker": 2}),
        ("multi_worker_mirrored", True, {"Worker": 2, "Evaluator": 1}),
        ("one_device", False, {"Chief": 1}),
        ("mirrored", False, {"Chief": 1}),
    ],
)
def test_tfjob_replica_types_follow_the_strategy(strategy, evaluator, replicas):
    objects = build(strategy, evaluator=evaluator)
    assert [o["kind"] for o in objects] == ["TFJob", "NetworkPolicy"]
    (tfjob,) = by_kind(objects, "TFJob")
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {t: s["replicas"] for t, s in specs.items()} == replicas
    # A parameter_server worker must never fail the TFJob: it restarts in place instead.
    assert {t: s["restartPolicy"] for t, s in specs.items()} == {
        t: "OnFailure" if (strategy, t) == ("parameter_server", "Worker") else "ExitCode"
        for t in specs
    }
    # The same layout as a local launch.
    layout = STRATEGIES[strategy].launch_layout(num_workers=2, num_ps=1)
    assert {t for t, n in layout.items() if n} | ({"evaluator"} if evaluator else set()) == {
        t.lower() for t in specs
    }


def test_tfjob_pods_run_tfdist_train_with_the_same_arguments():
    objects = build(
        "parameter_server",
        evaluator=True,
        cpu="2",
        memory="4Gi",
        gpus=1,
        backoff_limit=5,
        volume="runs:/shared",
        image_pull_policy="IfNotPresent",
    )
    (tfjob,) = by_kind(objects, "TFJob")
    assert tfjob["metadata"]["name"] == "mnist"
    assert tfjob["spec"]["runPolicy"] == {"backoffLimit": 5, "cleanPodPolicy": "Running"}
    gpus = {}
    for task_type, template in pod_templates(objects).items():
        c = container(template)
        assert c["name"] == "tensorflow", (
            "the training operator injects TF_CONFIG into 'tensorflow' only"
        )
        assert c["image"] == "registry.example/trainer:1" and c["imagePullPolicy"] == "IfNotPresent"
        assert c["command"] == ["tfdist-train"] and c["args"] == TRAIN_ARGS
        assert c["ports"] == [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
        assert {"name": "GRPC_FAIL_FAST", "value": "use_caller"} in c["env"]
        assert not any(e["name"] == "TF_CONFIG" for e in c["env"]), "the operator sets TF_CONFIG"
        assert c["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
        assert c["resources"]["limits"]["memory"] == "4Gi"
        gpus[task_type] = c["resources"]["limits"].get("nvidia.com/gpu", 0)
        assert c["volumeMounts"] == [{"name": "model-dir", "mountPath": "/shared"}]
        assert template["spec"]["volumes"] == [
            {"name": "model-dir", "persistentVolumeClaim": {"claimName": "runs"}}
        ]
        assert template["spec"]["automountServiceAccountToken"] is False
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert template["metadata"]["labels"][k8s.TYPE_LABEL] == task_type
    # GPUs where steps run: workers and the evaluator; not the ps, not the coordinating chief.
    assert gpus == {"chief": 0, "worker": 1, "ps": 0, "evaluator": 1}
    mwms = pod_templates(build("multi_worker_mirrored", gpus=2))
    assert container(mwms["worker"])["resources"]["limits"]["nvidia.com/gpu"] == 2


@pytest.mark.parametrize("flavor", k8s.FLAVORS)
def test_network_policy_admits_only_pods_of_the_same_job(flavor):
    objects = build("parameter_server", flavor=flavor, evaluator=True, port=2345)
    (policy,) = by_kind(objects, "NetworkPolicy")
    spec = policy["spec"]
    same_job = {"matchLabels": {k8s.JOB_LABEL: "mnist"}}
    assert spec["podSelector"] == same_job
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {"from": [{"podSelector": same_job}], "ports": [{"protocol": "TCP", "port": 2345}]}
    ]
    # No namespaceSelector or ipBlock: nothing outside the job's own pods is admitted.
    assert "namespaceSelector" not in json.dumps(spec) and "ipBlock" not in json.dumps(spec)
    for task_type, template in pod_templates(objects).items():
        assert template["metadata"]["labels"][k8s.JOB_LABEL] == "mnist", (
            f"{task_type} pods are not selected"
        )
        assert container(template)["ports"][0]["containerPort"] == 2345


@pytest.mark.parametrize("flavor", k8s.FLAVORS)
@pytest.mark.parametrize("grace_s", [None, 95])
def test_every_pod_has_the_grace_to_save_when_preempted(flavor, grace_s):
    """SIGTERM to SIGKILL covers a preempted ps's hold (--preemption_grace_s) while the chief saves."""
    settings = {} if grace_s is None else {"grace_s": grace_s}
    objects = build("parameter_server", flavor=flavor, evaluator=True, **settings)
    templates = pod_templates(objects)
    assert set(templates) == {"chief", "worker", "ps", "evaluator"}
    for template in templates.values():
        assert template["spec"]["terminationGracePeriodSeconds"] == (grace_s or k8s.DEFAULT_GRACE_S)
    assert k8s.DEFAULT_GRACE_S > 25, "the default must exceed tfdist-train's --preemption_grace_s"


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of an env value."""
    for name, replacement in env.items():
        value = value.replace(f"$({name})", replacement)
    return value


@pytest.mark.parametrize(
    "strategy, namespace", [("parameter_server", None), ("multi_worker_mirrored", "ml")]
)
def test_indexed_jobs_give_each_pod_a_tf_config_from_its_completion_index(strategy, namespace):
    objects = build(strategy, flavor="indexed", evaluator=True, namespace=namespace)
    kinds = [o["kind"] for o in objects]
    assert kinds[0] == "Service" and kinds[-1] == "NetworkPolicy" and set(kinds[1:-1]) == {"Job"}
    (service,) = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "mnist"
    assert (
        service["spec"]["clusterIP"] == "None"
        and service["spec"]["publishNotReadyAddresses"] is True
    )
    assert service["spec"]["selector"] == {k8s.JOB_LABEL: "mnist"}
    if namespace:
        assert all(o["metadata"]["namespace"] == namespace for o in objects)

    layout = k8s.task_layout(STRATEGIES[strategy], num_workers=2, num_ps=1, evaluator=True)
    jobs = {j["metadata"]["labels"][k8s.TYPE_LABEL]: j for j in by_kind(objects, "Job")}
    assert {t: j["spec"]["completions"] for t, j in jobs.items()} == layout
    roles = set()
    for task_type, job in jobs.items():
        spec = job["spec"]
        assert job["metadata"]["name"] == f"mnist-{task_type}"
        assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
        pod = spec["template"]["spec"]
        assert pod["subdomain"] == "mnist" and pod["restartPolicy"] == "Never"
        assert set(service["spec"]["selector"].items()) <= set(
            spec["template"]["metadata"]["labels"].items()
        )
        # ExitCode: 1-127 fail the job at once (a parameter_server worker: only its own index);
        # 128-255 (signals, preemption, a lost peer) are retried.
        # A pod Kubernetes evicted or preempted is re-created without spending the budget.
        disrupted, rule = spec["podFailurePolicy"]["rules"]
        assert disrupted == {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
        losable = (strategy, task_type) == ("parameter_server", "worker")
        assert rule["action"] == ("FailIndex" if losable else "FailJob")
        assert rule["onExitCodes"]["values"] == list(range(1, 128))
        c = container(spec["template"])
        assert c["command"] == ["tfdist-train"] and c["args"] == TRAIN_ARGS
        names = [e["name"] for e in c["env"]]
        assert names.index("TASK_INDEX") < names.index("TF_CONFIG"), (
            "$(TASK_INDEX) must be defined first"
        )
        (index_env,) = [e for e in c["env"] if e["name"] == "TASK_INDEX"]
        assert (
            index_env["valueFrom"]["fieldRef"]["fieldPath"]
            == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        )
        (tf_config_env,) = [e for e in c["env"] if e["name"] == "TF_CONFIG"]
        for index in range(spec["completions"]):
            config = cluster_lib.from_tf_config(
                expand(tf_config_env["value"], {"TASK_INDEX": str(index)})
            )
            assert (config.task_type, config.task_id) == (task_type, index)
            STRATEGIES[strategy].validate(config)
            # The task's own address is its pod's DNS name: <job name>-<index>.<subdomain>[.<namespace>.svc]
            hostname = f"{job['metadata']['name']}-{index}.{pod['subdomain']}"
            assert config.own_address.host == (
                f"{hostname}.{namespace}.svc" if namespace else hostname
            )
            assert config.own_address.port == 2222
            roles.add(config.role)
    assert roles == {f"{t}:{i}" for t, n in layout.items() for i in range(n)}


def test_indexed_single_process_has_no_tf_config():
    objects = build("one_device", flavor="indexed")
    (job,) = by_kind(objects, "Job")
    assert job["spec"]["completions"] == 1
    assert not any(
        e["name"] in ("TF_CONFIG", "TASK_INDEX") for e in container(job["spec"]["template"])["env"]
    )


@pytest.mark.parametrize(
    "policy, pod_restart, backoff, has_failure_policy",
    [
        ("ExitCode", "Never", k8s.DEFAULT_BACKOFF_LIMIT, True),
        ("OnFailure", "OnFailure", k8s.DEFAULT_BACKOFF_LIMIT, False),
        ("Never", "Never", 0, False),
    ],
)
def test_indexed_restart_policies(policy, pod_restart, backoff, has_failure_policy):
    for job in by_kind(build("parameter_server", flavor="indexed", restart_policy=policy), "Job"):
        if job["metadata"]["labels"][k8s.TYPE_LABEL] == "worker":
            # Each worker retries on its own: one that fails for good leaves the others running.
            assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
            assert (
                job["spec"]["backoffLimitPerIndex"] == backoff and "backoffLimit" not in job["spec"]
            )
        else:
            assert job["spec"]["template"]["spec"]["restartPolicy"] == pod_restart
            assert job["spec"]["backoffLimit"] == backoff
        assert ("podFailurePolicy" in job["spec"]) == has_failure_policy


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"train_args": [*TRAIN_ARGS, "--job_name=worker"]},
            ["--job_name=worker", "TF_CONFIG", "remove"],
        ),
        ({"train_args": [*TRAIN_ARGS, "--worker_hosts=a:1"]}, ["--worker_hosts=a:1"]),
        ({"volume": "no-path"}, ["--k8s_volume", "CLAIM:/mount/path"]),
        ({"name": "My_Job"}, ["DNS label", "'my-job'"]),
        ({"image": ""}, ["--image is required"]),
        ({"flavor": "helm"}, ["--k8s_flavor", "tfjob, indexed, jobset"]),
        (
            {"train_args": [*TRAIN_ARGS, "--preemption_grace_s=90"]},
            ["--k8s_grace_s (60)", "--preemption_grace_s (90)", "raise --k8s_grace_s"],
        ),
        ({"grace_s": 25}, ["--k8s_grace_s (25)", "--preemption_grace_s (25)"]),
        (
            {"train_args": [*TRAIN_ARGS, "--preemption_grace_s", "soon"]},
            ["--preemption_grace_s", "not a number of seconds"],
        ),
        ({"num_ps": 0}, ["parameter_server needs at least one ps task"]),
        ({"port": 0}, ["--k8s_port"]),
    ],
)
def test_bad_settings_name_the_fix(change, words):
    settings = manifest_settings("parameter_server", image="img:1")
    settings.update(change)
    with pytest.raises(k8s.ManifestError) as raised:
        k8s.JobSpec(**settings)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_dns_label():
    assert k8s.dns_label("/tmp/My Run_1/") == "tmp-my-run-1"
    assert k8s.dns_label("2024-run") == "job-2024-run"
    assert len(k8s.dns_label("x" * 100)) == 40


def test_yaml_emitter_keeps_every_value_as_it_was():
    tricky = {
        "strings": [
            "yes",
            "no",
            "on",
            "off",
            "y",
            "n",
            "true",
            "False",
            "null",
            "~",
            "2",
            "0x1F",
            "1e3",
            "4Gi",
            "1:20",
            ".inf",
            "-",
            "- x",
            "a: b",
            "#comment",
            "x #y",
            "'q'",
            '"dq"',
            "back\\slash",
            "line\nbreak",
            "tab\there",
            "",
            " lead",
            "trail ",
            "ünïcode",
            "$(TASK_INDEX)",
            "{a: 1}",
            "[1]",
            "--gin_bindings=MnistTrainer.filters=(8, 16)",
            "*ref",
            "&anchor",
            "!tag",
            "%dir",
            "@at",
            "`bt`",
            "Y",
            "N",
            "0o17",
            "1_000",
            "+1",
            ".5",
            "-2.5e-3",
            "0b101",
            "2024-01-02",
        ],
        "numbers": [0, -1, 2**40, 1.5, -0.25],
        "booleans": [True, False],
        "nothing": None,
        "empty": {"list": [], "dict": {}},
        "nested": [[1, "a"], [{"k": [{}]}], {"deep": {"deeper": ["x"]}}],
        "odd keys": {"yes": 1, "a b": 2, "nvidia.com/gpu": 3, "2": 4, "": 5},
    }
    shared = {"labels": {"app": "x"}, "codes": [1, 2, 127]}
    documents = [tricky, {"apiVersion": "v1", "kind": "List"}, {"a": shared, "b": shared}]
    text = k8s.to_yaml(documents)
    assert list(yaml.safe_load_all(text)) == documents
    assert text.startswith("---\n") and text.count("\n---\n") == len(documents) - 1, text
    assert not any(getattr(e, "anchor", None) for e in yaml.parse(text)), (
        "an object used twice is written twice"
    )
    assert "codes: [1, 2, 127]" in text


def test_yaml_quotes_what_kubernetes_reads_as_another_type():
    """kubectl's Go parser (goyaml.v2) reads y/n as booleans and 1e3, 0o17 as numbers; PyYAML's reader does not,
    so the round trip above cannot see these: they must not be written as plain scalars."""
    risky = [
        "y",
        "Y",
        "n",
        "N",
        "yes",
        "on",
        "off",
        "true",
        "null",
        "1e3",
        "0o17",
        "1_000",
        "+1",
        ".5",
        "2",
        "4Gi",
        "0x1F",
        "1:20",
        "2024-01-02",
    ]
    text = k8s.to_yaml([{"value": word} for word in risky])
    scalars = {
        e.value: e.style
        for e in yaml.parse(text)
        if isinstance(e, yaml.ScalarEvent) and e.value != "value"
    }
    assert scalars.keys() == set(risky)
    assert [w for w, style in scalars.items() if style not in ("'", '"')] == [], text


def test_pyyaml_is_a_runtime_dependency():
    """k8s.to_yaml writes the manifests with PyYAML, so an installed `tfdist-launch --emit=k8s` needs it:
    it must be in [project] dependencies, not only in the dev extra."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    assert any(d.lower().replace(" ", "").startswith("pyyaml>=6") for d in dependencies), (
        dependencies
    )
    assert k8s.output.yaml is yaml  # the writer (tfdist_trainer.launch.k8s.output) uses PyYAML
