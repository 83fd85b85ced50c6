"""BUILD.md's Kubernetes flag table and the emitted manifests agree on every default (issue 40).

The table once said `--backoff_limit` 3 while the TFJob said `backoffLimit: 5`. Here each
default is read back from what the launcher produces when no flag is given: a short child
process (tfdist_trainer.launch.flags defines its flags on absl's global FLAGS, whose names
tfdist-train's flags share in a test process) reports the keyword arguments
`emit.manifest_options` hands to k8s.JobSpec, the flags' defaults and the Kubernetes flags of
`tfdist-launch --help`; the manifests are built in process from exactly those arguments, and every
row of the table is compared with the objects. A flag in the table that no reader here knows, or a
Kubernetes flag missing from the table, fails too.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import clusterlib
import pytest
from k8s_docs import flag_table, kubernetes_section
from test_k8s_manifests import STRATEGIES, TRAIN_ARGS, by_kind, container, pod_templates

from tfdist_trainer.launch import k8s

#: What the launcher does with no flag given, as JSON; a few hundred ms, no TensorFlow.
_CLI_DEFAULTS = """
import json
from tfdist_trainer.launch import emit
from tfdist_trainer.launch.flags import FLAGS, HELP_GROUPS
FLAGS(["tfdist-launch", "--emit=k8s"])
print(json.dumps({
    "options": emit.manifest_options(),
    "flags": {name: FLAGS[name].default for name in FLAGS},
    "group": list(dict(HELP_GROUPS)["Kubernetes (manifests instead of a run)"]),
}, default=str))
"""
#: The launcher flags the table documents besides the Kubernetes group ("as for a local launch").
SHARED_FLAGS = ("num_workers", "num_ps", "evaluator", "restart_policy", "backoff_limit")


@pytest.fixture(scope="module")
def cli() -> dict:
    result = subprocess.run(
        [clusterlib.PYTHON, "-c", _CLI_DEFAULTS],
        capture_output=True,
        text=True,
        env=clusterlib.base_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def emitted(cli) -> dict[str, list[dict]]:
    """flavor -> the objects a parameter_server job gets with every flag left at its default
    (--image aside, which has none), the default flavor under 'default'."""
    options = {**cli["options"], "image": "registry.example/trainer:1"}
    common = dict(
        strategy_config=STRATEGIES["parameter_server"], name="run1", train_args=TRAIN_ARGS
    )
    objects = {"default": k8s.manifests(k8s.JobSpec(**common, **options))}
    for flavor in k8s.FLAVORS:
        objects[flavor] = k8s.manifests(k8s.JobSpec(**common, **{**options, "flavor": flavor}))
    return objects


def _one(values: list) -> str:
    """The value every pod or object has, as the table writes it; several values fail the test."""
    assert len(set(map(str, values))) == 1, values
    return str(values[0])


def _containers(objects: list[dict]) -> list[dict]:
    return [container(t) for t in pod_templates(objects).values()]


def _absent(values: list, word: str = "none") -> str:
    """`word` when no object sets the field, else what they set (which then fails the comparison)."""
    present = [v for v in values if v is not None]
    return word if not present else str(present)


def _backoff(emitted: dict[str, list[dict]]) -> str:
    """The restart budget in each flavor's own field: the TFJob's, the JobSet's, the chief Job's."""
    (tfjob,) = by_kind(emitted["tfjob"], "TFJob")
    (jobset,) = by_kind(emitted["jobset"], "JobSet")
    jobs = {j["metadata"]["labels"][k8s.TYPE_LABEL]: j for j in by_kind(emitted["indexed"], "Job")}
    return _one(
        [
            tfjob["spec"]["runPolicy"]["backoffLimit"],
            jobset["spec"]["failurePolicy"]["maxRestarts"],
            jobs["chief"]["spec"]["backoffLimit"],
        ]
    )


def _replicas(objects: list[dict]) -> dict[str, int]:
    (tfjob,) = by_kind(objects, "TFJob")
    return {t: s["replicas"] for t, s in tfjob["spec"]["tfReplicaSpecs"].items()}


#: Each documented flag -> its default as the table writes it, read from what the launcher emits.
READERS: dict[str, Callable[[dict, dict[str, list[dict]]], str]] = {
    "--image": lambda cli, e: "required" if cli["options"]["image"] is None else "set",
    "--k8s_flavor": lambda cli, e: {"TFJob": "tfjob", "Service": "indexed", "JobSet": "jobset"}[
        e["default"][0]["kind"]
    ],
    "--k8s_workdir": lambda cli, e: _one(
        [c.get("workingDir") for f in k8s.FLAVORS for c in _containers(e[f])]
    ),
    "--k8s_grace_s": lambda cli, e: _one(
        [
            t["spec"]["terminationGracePeriodSeconds"]
            for f in k8s.FLAVORS
            for t in pod_templates(e[f]).values()
        ]
    ),
    "--k8s_name": lambda cli, e: "from --model_dir" if cli["flags"]["k8s_name"] is None else "set",
    "--k8s_namespace": lambda cli, e: _absent(
        [o["metadata"].get("namespace") for o in e["default"]], "kubectl's"
    ),
    "--num_workers": lambda cli, e: str(_replicas(e["default"])["Worker"]),
    "--num_ps": lambda cli, e: str(_replicas(e["default"])["PS"]),
    "--evaluator": lambda cli, e: "on" if "Evaluator" in _replicas(e["default"]) else "off",
    "--cpu": lambda cli, e: _absent(
        [c.get("resources", {}).get("requests", {}).get("cpu") for c in _containers(e["default"])]
    ),
    "--memory": lambda cli, e: _absent(
        [c.get("resources", {}).get("limits", {}).get("memory") for c in _containers(e["default"])]
    ),
    "--k8s_resources": lambda cli, e: _absent(
        [*cli["options"]["resources"], *(c.get("resources") for c in _containers(e["default"]))]
    ),
    "--gpus": lambda cli, e: _one(
        [
            c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
            for c in _containers(e["default"])
        ]
    ),
    "--k8s_volume": lambda cli, e: _absent(
        [t["spec"].get("volumes") for t in pod_templates(e["default"]).values()]
    ),
    "--k8s_port": lambda cli, e: _one(
        [p["containerPort"] for c in _containers(e["default"]) for p in c["ports"]]
    ),
    "--restart_policy": lambda cli, e: _one(
        [
            s["restartPolicy"]
            for t, s in by_kind(e["default"], "TFJob")[0]["spec"]["tfReplicaSpecs"].items()
            if t != "Worker"  # a parameter_server worker always restarts in place (OnFailure)
        ]
    ),
    "--backoff_limit": lambda cli, e: _backoff(e),
    "--image_pull_policy": lambda cli, e: _absent(
        [c.get("imagePullPolicy") for c in _containers(e["default"])]
    ),
    "--k8s_format": lambda cli, e: cli["flags"]["k8s_format"],
    "--emit_file": lambda cli, e: (
        "stdout" if cli["flags"]["emit_file"] in (None, "None") else "set"
    ),
}


def test_every_kubernetes_flag_is_in_the_table(cli):
    documented = flag_table(kubernetes_section())
    expected = {f"--{name}" for name in [*cli["group"], *SHARED_FLAGS] if name != "emit"}
    assert expected - documented.keys() == set(), "flags of --emit=k8s missing from BUILD.md"
    assert documented.keys() - READERS.keys() == set(), "a documented flag this test cannot check"


@pytest.mark.parametrize("flag", sorted(READERS))
def test_the_documented_default_is_what_the_manifests_get(flag, cli, emitted):
    documented = flag_table(kubernetes_section())
    assert flag in documented, f"{flag} is not in BUILD.md's Kubernetes flag table"
    assert READERS[flag](cli, emitted) == documented[flag], (
        f"BUILD.md says {flag} defaults to {documented[flag]!r}"
    )


def test_the_python_api_has_the_launchers_defaults(cli):
    """A k8s.JobSpec of the job alone builds what the launcher builds with no flag given."""
    common = dict(
        strategy_config=STRATEGIES["parameter_server"],
        name="run1",
        train_args=TRAIN_ARGS,
        image="registry.example/trainer:1",
    )
    options = {**cli["options"], "image": common["image"]}
    assert k8s.manifests(k8s.JobSpec(**common)) == k8s.manifests(
        k8s.JobSpec(**{**common, **options})
    )
