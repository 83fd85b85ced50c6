"""Per-role resources (--k8s_resources=ROLE:cpu=N,memory=M) and the pods' workingDir (--k8s_workdir).

A recommender's ps need the memory and its workers the CPU: --cpu/--memory size every task and
--k8s_resources one role, key by key. The pods run in --k8s_workdir (/workspace), where the
relative gin paths and modules of the arguments resolve. Every flavor's objects stay valid
against the real schemas; every bad value is one ManifestError sentence naming the fix (the
command line turns it into exit 2: tests/test_k8s.py).
"""

from __future__ import annotations

import pytest
from k8s_validate import validate
from test_k8s_manifests import build, container, manifest_settings, pod_templates

from tfdist_trainer.launch import k8s
from tfdist_trainer.launch.k8s.resources import check_quantity


def resources_by_role(objects: list[dict]) -> dict[str, dict]:
    return {t: container(p).get("resources", {}) for t, p in pod_templates(objects).items()}


@pytest.mark.parametrize("flavor", k8s.FLAVORS)
def test_each_role_gets_its_own_resources_on_top_of_every_tasks(flavor):
    objects = build(
        "parameter_server",
        flavor=flavor,
        evaluator=True,
        cpu="2",
        memory="4Gi",
        gpus=1,
        resources=["ps:memory=64Gi", "worker:cpu=8,memory=16Gi"],
    )
    assert [e for o in objects for e in validate(o)] == []
    got = resources_by_role(objects)
    assert got["ps"] == {"requests": {"cpu": "2", "memory": "64Gi"}, "limits": {"memory": "64Gi"}}
    assert got["worker"] == {
        "requests": {"cpu": "8", "memory": "16Gi"},
        "limits": {"memory": "16Gi", "nvidia.com/gpu": 1},
    }
    assert got["chief"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert got["evaluator"]["requests"] == {"cpu": "2", "memory": "4Gi"}


def test_a_role_alone_sizes_only_that_role():
    got = resources_by_role(build("parameter_server", resources=["ps:cpu=500m"]))
    assert got == {"chief": {}, "worker": {}, "ps": {"requests": {"cpu": "500m"}}}


@pytest.mark.parametrize("flavor", k8s.FLAVORS)
def test_the_pods_run_in_the_workdir(flavor):
    for workdir, expected in [(None, k8s.DEFAULT_WORKDIR), ("/srv/project", "/srv/project")]:
        settings = {} if workdir is None else {"workdir": workdir}
        objects = build("multi_worker_mirrored", flavor=flavor, evaluator=True, **settings)
        assert [e for o in objects for e in validate(o)] == []
        assert {container(t)["workingDir"] for t in pod_templates(objects).values()} == {expected}
    # Empty: the image's own WORKDIR.
    objects = build("multi_worker_mirrored", flavor=flavor, workdir="")
    assert all("workingDir" not in container(t) for t in pod_templates(objects).values())


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"resources": ["gpu:cpu=2"]},
            "--k8s_resources=gpu:cpu=2: 'gpu' is not a role; use one of chief, worker, ps, "
            "evaluator, dispatcher.",
        ),
        (
            {"resources": ["evaluator:cpu=2"]},
            "--k8s_resources names evaluator, but a parameter_server job has no evaluator task "
            "(its roles: chief, worker, ps).",
        ),
        (
            {"resources": ["ps:memory=16GB"]},
            "--k8s_resources=ps:memory=16GB: '16GB' is not a Kubernetes quantity for memory; use "
            "e.g. 16Gi or 512Mi.",
        ),
        (
            {"resources": ["worker:cpu=two"]},
            "--k8s_resources=worker:cpu=two: 'two' is not a Kubernetes quantity for cpu; use e.g. "
            "2 or 500m.",
        ),
        (
            {"resources": ["ps:memory=512m"]},
            "--k8s_resources=ps:memory=512m: memory 512m means 512 thousandths of a byte; write "
            "512Mi (mebibytes).",
        ),
        (
            {"resources": ["ps"]},
            "--k8s_resources=ps must look like ROLE:cpu=N,memory=M, e.g. ps:cpu=2,memory=16Gi.",
        ),
        (
            {"resources": ["ps:cpus=2"]},
            "--k8s_resources=ps:cpus=2: 'cpus=2' is not cpu=N or memory=M; those are the two keys.",
        ),
        (
            {"resources": ["ps:cpu=1,cpu=2"]},
            "--k8s_resources=ps:cpu=1,cpu=2 gives cpu twice; give it once.",
        ),
        (
            {"resources": ["ps:cpu=1", "ps:memory=2Gi"]},
            "--k8s_resources names ps twice; give each role once.",
        ),
        (
            {"cpu": "-1"},
            "--cpu=-1: '-1' is not a Kubernetes quantity for cpu; use e.g. 2 or 500m.",
        ),
        (
            {"workdir": "project"},
            "--k8s_workdir must be an absolute path in the image (e.g. /workspace), got 'project'.",
        ),
    ],
)
def test_bad_resources_and_workdir_are_one_sentence(change, message):
    settings = manifest_settings("parameter_server", **change)
    with pytest.raises(k8s.ManifestError) as raised:
        k8s.manifests(k8s.JobSpec(**settings))
    assert str(raised.value) == message


@pytest.mark.parametrize("good", ["2", "500m", "0.5", ".5", "1e3", "16Gi", "512Mi", "1.5G", "2k"])
def test_kubernetes_quantities_are_taken(good):
    assert check_quantity("cpu", good, "--cpu") == good


@pytest.mark.parametrize("bad", ["", "16GB", "4gi", "2K", "-1", "+1", "1.2.3", "Gi", "2 ", "1e"])
def test_what_the_api_server_would_refuse_is_refused(bad):
    with pytest.raises(k8s.ResourceError, match="is not a Kubernetes quantity"):
        check_quantity("memory", bad, "--memory")


def test_the_launcher_says_where_the_pods_look_for_gin_files_and_modules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gin").mkdir()
    (tmp_path / "gin" / "train.gin").write_text("")
    gin_files = ["gin/train.gin", "strategies/parameter_server.gin", "/abs/extra.gin"]
    assert k8s.image_path_notes(gin_files, ["my_trainer"], "/workspace") == [
        "the pods look for gin/train.gin, module my_trainer in their workingDir /workspace "
        "(--k8s_workdir), not here: the image needs them there (BUILD.md, Kubernetes, The image)",
        "/abs/extra.gin must be at that path in the image",
    ]
    (note,) = k8s.image_path_notes(["gin/train.gin"], [], "")
    assert "in their image's WORKDIR" in note
    # The package's own gin files (found by name) and no module: nothing to say.
    assert k8s.image_path_notes(["strategies/parameter_server.gin"], [], "/workspace") == []
