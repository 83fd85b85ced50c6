"""Kubernetes manifests from the command line (`tfdist-launch --emit=k8s`), parsed back; no cluster needed.

The manifests' structure (replica types, TF_CONFIG, NetworkPolicy, the YAML) is
tested in process in tests/unit/test_k8s_manifests.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import clusterlib
import pytest
import yaml
from clusterlib import FAST_MNIST, REPO, launch_cmd, strategy_gin
from test_k8s_manifests import by_kind, container

# -- the command line --------------------------------------------------------------------------


def mnist(strategy: str, model_dir: str) -> list[str]:
    return [*FAST_MNIST, strategy_gin(strategy), f"--model_dir={model_dir}"]


def emit(launch_args: list[str], train_args: list[str]) -> subprocess.CompletedProcess:
    """tfdist-launch --emit=k8s ... -- train_args, from the repository; its output captured."""
    return subprocess.run(
        launch_cmd(["--emit=k8s", *launch_args], train_args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clusterlib.base_env(),
        timeout=120,
    )


def test_emit_k8s_tfjob_from_the_gin_files(tmp_path):
    """Relative gin paths, as a user's project has them: the pods look for them in the workdir."""
    model_dir = f"gs://bucket/run-{uuid.uuid4().hex[:6]}"
    train_args = [
        "--gin_file=configs/mnist.gin",
        *FAST_MNIST[1:],
        "--gin_file=configs/strategies/parameter_server.gin",
        f"--model_dir={model_dir}",
    ]
    r = emit(
        [
            "--image=registry.example/trainer:1",
            "--num_workers=3",
            "--num_ps=2",
            "--evaluator",
            "--cpu=2",
            "--memory=4Gi",
            "--k8s_resources=ps:memory=16Gi",
            "--k8s_resources=worker:cpu=6",
            "--gpus=1",
        ],
        train_args,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == ["TFJob", "NetworkPolicy"]
    (tfjob,) = by_kind(objects, "TFJob")
    assert tfjob["metadata"]["name"] == model_dir.rsplit("/", 1)[1]
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {t: s["replicas"] for t, s in specs.items()} == {
        "Chief": 1,
        "Worker": 3,
        "PS": 2,
        "Evaluator": 1,
    }
    assert {t: s["restartPolicy"] for t, s in specs.items()} == {
        "Chief": "ExitCode",
        "Worker": "OnFailure",
        "PS": "ExitCode",
        "Evaluator": "ExitCode",
    }
    assert all(container(s["template"])["args"] == train_args for s in specs.values())
    assert {container(s["template"])["workingDir"] for s in specs.values()} == {"/workspace"}
    requests = {t: container(s["template"])["resources"]["requests"] for t, s in specs.items()}
    assert requests == {
        "Chief": {"cpu": "2", "memory": "4Gi"},
        "Worker": {"cpu": "6", "memory": "4Gi"},
        "PS": {"cpu": "2", "memory": "16Gi"},
        "Evaluator": {"cpu": "2", "memory": "4Gi"},
    }
    assert "[launch] TFJob, NetworkPolicy for parameter_server" in r.stderr
    assert (
        "[launch] the pods look for configs/mnist.gin, configs/strategies/parameter_server.gin in "
        "their workingDir /workspace (--k8s_workdir)" in r.stderr
    ), r.stderr
    assert clusterlib.no_process_left(model_dir) == []


def test_emit_k8s_indexed_json_to_a_file(tmp_path):
    model_dir = str(tmp_path / "run2")
    out = tmp_path / "job.json"
    r = emit(
        [
            "--k8s_flavor=indexed",
            "--k8s_format=json",
            "--image=img:1",
            f"--emit_file={out}",
            "--k8s_name=digits",
            "--restart_policy=OnFailure",
        ],
        mnist("multi_worker_mirrored", model_dir),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "", "the manifests went to --emit_file, not stdout"
    listing = json.loads(out.read_text())
    assert listing["kind"] == "List"
    assert [(o["kind"], o["metadata"]["name"]) for o in listing["items"]] == [
        ("Service", "digits"),
        ("Job", "digits-worker"),
        ("NetworkPolicy", "digits-same-job-only"),
    ]
    (job,) = by_kind(listing["items"], "Job")
    assert (
        job["spec"]["completions"] == 2
        and job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    )
    assert "must be storage every pod shares" in r.stderr  # a local path: the user is told
    assert not os.path.exists(model_dir), "emitting manifests must not create the model_dir"


def test_emit_k8s_jobset_for_multi_worker_mirrored(tmp_path):
    """The JobSet a user applies: the set restarts as a whole, a permanent exit code fails it."""
    model_dir = "gs://bucket/lm-run"
    r = emit(
        [
            "--k8s_flavor=jobset",
            "--image=img:1",
            "--num_workers=3",
            "--evaluator",
            "--backoff_limit=5",
            "--k8s_grace_s=120",
            "--k8s_namespace=ml",
        ],
        mnist("multi_worker_mirrored", model_dir),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    objects = list(yaml.safe_load_all(r.stdout))
    assert [o["kind"] for o in objects] == ["JobSet", "NetworkPolicy"]
    (jobset,) = by_kind(objects, "JobSet")
    assert jobset["metadata"] == {
        "name": "lm-run",
        "namespace": "ml",
        "labels": jobset["metadata"]["labels"],
    }
    spec = jobset["spec"]
    assert spec["failurePolicy"]["maxRestarts"] == 5
    assert spec["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    assert spec["successPolicy"]["targetReplicatedJobs"] == ["worker", "evaluator"]
    jobs = {j["name"]: j["template"]["spec"] for j in spec["replicatedJobs"]}
    assert jobs["worker"]["completions"] == 3
    pod = jobs["worker"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    (tf_config,) = [
        e["value"] for e in container(jobs["worker"]["template"])["env"] if e["name"] == "TF_CONFIG"
    ]
    assert "lm-run-worker-0-2.lm-run.ml.svc:2222" in tf_config
    assert "[launch] JobSet, NetworkPolicy for multi_worker_mirrored" in r.stderr


@pytest.mark.parametrize(
    "launch_args, extra, words",
    [
        (["--emit=k8s"], [], ["--image is required"]),
        (["--emit=k8s", "--image=i"], ["--job_name=chief"], ["--job_name=chief", "TF_CONFIG"]),
        (
            ["--emit=k8s", "--image=i", "--k8s_flavor=jobset", "--k8s_grace_s=20"],
            [],
            ["--k8s_grace_s (20)", "--preemption_grace_s (25)", "raise --k8s_grace_s"],
        ),
        (
            ["--emit=k8s", "--image=i", "--k8s_resources=gpu:cpu=1"],
            [],
            [
                "--k8s_resources=gpu:cpu=1: 'gpu' is not a role; use one of chief, worker, ps, "
                "evaluator, dispatcher."
            ],
        ),
        (
            ["--emit=k8s", "--image=i", "--k8s_resources=ps:cpu=2,memory=16GB"],
            [],
            [
                "--k8s_resources=ps:cpu=2,memory=16GB: '16GB' is not a Kubernetes quantity for "
                "memory; use e.g. 16Gi or 512Mi."
            ],
        ),
    ],
)
def test_emit_k8s_errors_are_one_sentence(tmp_path, launch_args, extra, words):
    """Caught before TensorFlow is imported (a strategy/layout mismatch is covered in-process above)."""
    r = clusterlib.run(
        launch_cmd(launch_args, [*mnist("parameter_server", str(tmp_path / "m")), *extra]),
        timeout=120,
    )
    assert r.returncode == 2, r.stdout[-3000:]
    errors = [line for line in r.stdout.splitlines() if line.startswith("[launch] error:")]
    assert len(errors) == 1, r.stdout[-3000:]
    assert errors[0].endswith("."), errors[0]
    for word in words:
        assert word in errors[0], errors[0]
    assert "apiVersion" not in r.stdout and "Traceback" not in r.stdout


def test_data_service_is_emitted_by_jobset_and_refused_by_tfjob_in_one_sentence():
    train_args = [
        *mnist("parameter_server", "gs://bucket/run-ds"),
        "--gin_bindings=parameter_server.data_service=True",
    ]
    r = emit(["--image=registry.example/trainer:1", "--k8s_flavor=jobset"], train_args)
    assert r.returncode == 0, r.stderr[-3000:]
    (jobset,) = by_kind(list(yaml.safe_load_all(r.stdout)), "JobSet")
    assert "dispatcher" in [j["name"] for j in jobset["spec"]["replicatedJobs"]]
    r = emit(["--image=registry.example/trainer:1", "--k8s_flavor=tfjob"], train_args)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(
        r"a TFJob \(training-operator release-1\.9\) has no replica type for the dispatcher task "
        r"that parameter_server\.data_service=True adds; use --k8s_flavor=jobset or "
        r"--k8s_flavor=indexed\.",
        r.stderr,
    ), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
