"""Every object `tfdist-launch --emit=k8s` writes is valid against the real schemas.

The schemas are the upstream ones (tests/k8s_schemas/README.md: JobSet v0.12.0, TFJob of the
training operator v1.9.0, Kubernetes 1.33's built-in Job, Service and NetworkPolicy), checked by
tests/unit/k8s_validate.py as strictly as `kubectl apply --validate=strict`: an unknown field is
an error. Every flavor in k8s.FLAVORS (a new one is picked up here by itself) x every strategy x
evaluator or not x every restart policy x the options left out or all given: each object, as it
reads back from the YAML that is written, validates. Then the validator is
shown to fail where it must: an unknown field, a wrong type, a value outside a schema's enum.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import os

import pytest
import yaml
from k8s_validate import SCHEMA_DIR, kinds, transform, validate
from test_k8s_manifests import STRATEGIES, TRAIN_ARGS, pod_templates

from tfdist_trainer.launch import k8s

CONFIGS = STRATEGIES
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RESTART_POLICIES = ("Never", "OnFailure", "ExitCode")
OPTIONS = {
    "defaults": {},
    "all-options": {
        "namespace": "ml",
        "volume": "runs:/shared",
        "gpus": 2,
        "cpu": "500m",
        "memory": "4Gi",
        "image_pull_policy": "IfNotPresent",
        "backoff_limit": 5,
        "port": 2345,
    },
}


def manifests(flavor: str, strategy: str, **settings) -> list[dict]:
    defaults = dict(name="mnist", image="registry.example/trainer:1", train_args=TRAIN_ARGS)
    return k8s.manifests(
        k8s.JobSpec(strategy_config=CONFIGS[strategy], flavor=flavor, **{**defaults, **settings})
    )


def errors_of(objects: list[dict]) -> list[tuple[str, str]]:
    """(the object's kind and name, an error) for every error of every object."""
    return [
        (f"{o['kind']} {o.get('metadata', {}).get('name', '')}", e)
        for o in objects
        for e in validate(o)
    ]


@pytest.mark.parametrize(
    "flavor, strategy, evaluator, restart_policy, options",
    list(itertools.product(k8s.FLAVORS, CONFIGS, (False, True), RESTART_POLICIES, OPTIONS)),
)
def test_every_emitted_object_is_valid(flavor, strategy, evaluator, restart_policy, options):
    objects = manifests(
        flavor, strategy, evaluator=evaluator, restart_policy=restart_policy, **OPTIONS[options]
    )
    # What kubectl is given: the YAML documents (read by libyaml where PyYAML has it: ten times
    # faster). The JSON List holds the same objects (test_k8s_manifests.build).
    errors = errors_of(list(yaml.load_all(k8s.to_yaml(objects), Loader=SAFE_LOADER)))
    assert errors == []


def test_there_is_a_schema_for_every_kind_emitted():
    emitted = {
        (o["apiVersion"], o["kind"])
        for flavor in k8s.FLAVORS
        for o in manifests(flavor, "parameter_server")
    }
    assert emitted <= set(kinds()), emitted - set(kinds())
    # The JobSet schema is there whether or not a flavor emits JobSets.
    assert ("jobset.x-k8s.io/v1alpha2", "JobSet") in kinds()


# -- the validator fails where it must, at the path of the mistake -------------------------

#: flavor -> (the kind that holds the pods, the path of the worker's pod template in it).
POD_TEMPLATE_PATH = {
    "tfjob": ("TFJob", "spec.tfReplicaSpecs.Worker.template"),
    "indexed": ("Job", "spec.template"),
    "jobset": ("JobSet", "spec.replicatedJobs[1].template.spec.template"),
}
#: flavor -> the keys to the worker's replica count, and their path as an error names it.
REPLICAS_PATH = {
    "tfjob": (
        ("spec", "tfReplicaSpecs", "Worker", "replicas"),
        "spec.tfReplicaSpecs.Worker.replicas",
    ),
    "indexed": (("spec", "completions"), "spec.completions"),
    "jobset": (("spec", "replicatedJobs", 1, "replicas"), "spec.replicatedJobs[1].replicas"),
}


def worker_object(flavor: str) -> tuple[dict, dict]:
    """The valid object (parameter_server, restart policy Never) that holds the worker pods, and
    their pod template inside it."""
    kind, _ = POD_TEMPLATE_PATH[flavor]
    objects = manifests(flavor, "parameter_server", restart_policy="Never")
    (owner,) = [o for o in objects if o["kind"] == kind and "worker" in pod_templates([o])]
    assert validate(owner) == []
    return owner, pod_templates([owner])["worker"]


@pytest.mark.parametrize("flavor", [f for f in k8s.FLAVORS if f in POD_TEMPLATE_PATH])
def test_an_unknown_field_in_a_pod_is_reported_with_its_path(flavor):
    owner, template = worker_object(flavor)
    _, path = POD_TEMPLATE_PATH[flavor]
    template["spec"]["hostNetwrok"] = True
    template["spec"]["containers"][0]["imagePullPolice"] = "Always"
    template["metadata"]["label"] = {"a": "b"}
    assert validate(owner) == [
        f"{path}.metadata.label: unknown field",
        f"{path}.spec.containers[0].imagePullPolice: unknown field",
        f"{path}.spec.hostNetwrok: unknown field",
    ]


@pytest.mark.parametrize("flavor", [f for f in k8s.FLAVORS if f in REPLICAS_PATH])
@pytest.mark.parametrize("wrong", ["2", 2.0, True, None])
def test_a_wrong_type_is_reported_with_its_path(flavor, wrong):
    owner, _ = worker_object(flavor)
    (*parents, field), path = REPLICAS_PATH[flavor]
    functools.reduce(operator.getitem, parents, owner)[field] = wrong
    assert validate(owner) == [f"{path}: {wrong!r} is not of type 'integer'"]


def hand_made_jobset() -> dict:
    """A small JobSet with a failure policy rule: the JobSet schema, whether or not emitted."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "tensorflow", "image": "img:1"}]}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "mnist", "labels": {"app": "mnist"}},
        "spec": {
            "failurePolicy": {
                "maxRestarts": 3,
                "restartStrategy": "BlockingRecreate",
                "rules": [
                    {"name": "permanent", "action": "FailJobSet", "onJobFailureReasons": ["X"]}
                ],
            },
            "replicatedJobs": [
                {"name": "worker", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}
            ],
        },
    }


def test_a_value_outside_an_enum_is_reported_with_its_path():
    jobset = hand_made_jobset()
    assert validate(jobset) == []
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "Bogus"
    jobset["spec"]["failurePolicy"]["restartStrategy"] = "Later"
    errors = validate(jobset)
    assert len(errors) == 2, errors
    assert errors[0].startswith("spec.failurePolicy.restartStrategy: 'Later' is not one of [")
    assert errors[1].startswith("spec.failurePolicy.rules[0].action: 'Bogus' is not one of [")
    assert "'FailJobSet'" in errors[1] and "'RestartJobSet'" in errors[1]


def test_enums_are_checked_only_where_the_schema_has_them():
    """The TFJob CRD (v1.9.0) gives restartPolicy as a plain string, and Kubernetes' OpenAPI
    schemas name a built-in field's values only in its description: the operator and the API
    server reject these values, the schemas do not."""
    tfjob, _ = worker_object("tfjob")
    tfjob["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "Bogus"
    assert validate(tfjob) == []
    job, _ = worker_object("indexed")
    job["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Bogus", "onExitCodes": {"operator": "In", "values": [1]}}]
    }
    assert validate(job) == []


def test_int_or_string_quantities_and_int32():
    (service, job, _) = manifests("indexed", "one_device", restart_policy="Never")
    for target_port in (2222, "grpc"):
        service["spec"]["ports"][0]["targetPort"] = target_port
        assert validate(service) == []
    service["spec"]["ports"][0]["targetPort"] = 22.5
    assert validate(service) == [
        "spec.ports[0].targetPort: 22.5 is not valid under any of the given schemas"
    ]

    resources = job["spec"]["template"]["spec"]["containers"][0].setdefault("resources", {})
    resources["limits"] = {"cpu": 0.5, "memory": "4Gi", "nvidia.com/gpu": 1}
    assert validate(job) == []
    resources["limits"]["cpu"] = True
    port = job["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    port["containerPort"] = 2**40
    assert validate(job) == [
        f"spec.template.spec.containers[0].ports[0].containerPort: {2**40} is out of range for int32",
        "spec.template.spec.containers[0].resources.limits.cpu: True is not valid under any of the given schemas",
    ]


def test_metadata_of_a_custom_resource_is_checked_as_object_meta():
    jobset = hand_made_jobset()
    jobset["metadata"]["labels"]["n"] = 1
    jobset["metadata"]["lables"] = {}
    assert validate(jobset) == [
        "metadata.labels.n: 1 is not of type 'string'",
        "metadata.lables: unknown field",
    ]


def test_a_list_has_each_item_validated():
    listed = json.loads(
        k8s.to_json(manifests("indexed", "parameter_server", restart_policy="Never"))
    )
    assert validate(listed) == []
    jobset = hand_made_jobset()
    jobset["spec"]["replicatedJobs"][0]["replicas"] = "1"
    assert validate({"apiVersion": "v1", "kind": "List", "items": [jobset], "extra": 1}) == [
        "extra: unknown field",
        "items[0].spec.replicatedJobs[0].replicas: '1' is not of type 'integer'",
    ]


def test_an_unknown_kind_is_an_error():
    (error,) = validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    assert error.startswith("<root>: no schema for apiVersion 'v1', kind 'ConfigMap'"), error


def test_the_stored_schemas_are_trimmed_and_name_their_source():
    names = sorted(n for n in os.listdir(SCHEMA_DIR) if n.endswith(".json"))
    assert sum(os.path.getsize(os.path.join(SCHEMA_DIR, n)) for n in names) < 512 * 1024
    with open(os.path.join(SCHEMA_DIR, "README.md")) as f:
        readme = f.read()
    described: list[str] = []

    def note(node: dict) -> dict:
        described.extend(["description"] if "description" in node else [])
        return node

    for name in names:
        with open(os.path.join(SCHEMA_DIR, name)) as f:
            doc = json.load(f)
        assert name in readme and doc["source"] in readme, name
        schemas = doc.get("components", {}).get("schemas", {})
        for schema in [*schemas.values(), doc.get("openAPIV3Schema", {})]:
            transform(schema, note)
        assert described == [], name
