"""k8s.JobSpec: a job's manifest settings, checked once when it is made, then read by every flavor.

A JobSpec that exists is a valid one (frozen: it cannot be changed afterwards); its derived fields
(layout, each role's resources, the volume mount) are computed from the settings once. A bad
setting is one sentence raised as a ManifestError, a ConfigError: tfdist-launch --emit=k8s exits 2.
Every setting's sentence is in test_k8s_manifests.py and test_k8s_resources.py.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_k8s_manifests import STRATEGIES, TRAIN_ARGS

from tfdist_trainer.errors import EXIT_CONFIG, ConfigError
from tfdist_trainer.launch import k8s


def spec(strategy: str = "parameter_server", **settings) -> k8s.JobSpec:
    job = dict(
        strategy_config=STRATEGIES[strategy],
        name="mnist",
        image="registry.example/trainer:1",
        train_args=TRAIN_ARGS,
    )
    return k8s.JobSpec(**{**job, **settings})


def test_a_spec_holds_its_settings_and_what_they_imply():
    job = spec(
        num_workers=3,
        evaluator=True,
        cpu="2",
        resources=["ps:cpu=4,memory=16Gi"],
        volume="shared:/mnt/shared",
        workdir="",
    )
    assert job.layout == {"chief": 1, "worker": 3, "ps": 1, "evaluator": 1}
    assert job.mount == ("shared", "/mnt/shared")
    assert job.workdir is None  # '': the image's own WORKDIR
    assert job.train_args == tuple(TRAIN_ARGS) and job.resources == ("ps:cpu=4,memory=16Gi",)
    assert set(job.role_resources) == set(job.layout)
    assert job.role_resources["ps"] != job.role_resources["worker"]


def test_a_spec_cannot_change_after_its_check():
    job = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.port = 0  # type: ignore[misc]
    # a changed copy is checked again
    with pytest.raises(k8s.ManifestError, match=r"^--k8s_port must be in 1\.\.65535, got 0\.$"):
        dataclasses.replace(job, port=0)


def test_equal_settings_are_equal_specs_and_build_the_same_objects():
    assert spec() == spec(train_args=list(TRAIN_ARGS))
    assert k8s.manifests(spec()) == k8s.manifests(spec(train_args=list(TRAIN_ARGS)))
    assert spec() != spec(num_workers=3)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"flavor": "helm"}, "--k8s_flavor must be one of tfjob, indexed, jobset, got 'helm'."),
        (
            {"image": ""},
            "--image is required with --emit=k8s; name an image that has tfdist_trainer, your "
            "Trainer and your gin files installed.",
        ),
        (
            {"restart_policy": "Always"},
            "restart policy must be Never, OnFailure or ExitCode, got 'Always'.",
        ),
        ({"gpus": -1}, "--gpus and --backoff_limit must be >= 0."),
        ({"volume": "claim"}, "--k8s_volume must look like CLAIM:/mount/path, got 'claim'."),
    ],
)
def test_a_bad_setting_is_one_sentence_and_exit_2(settings, message):
    with pytest.raises(ConfigError) as raised:
        spec(**settings)
    assert type(raised.value) is k8s.ManifestError
    assert raised.value.exit_code == EXIT_CONFIG
    assert str(raised.value) == message


def test_the_strategys_own_sentence_is_a_manifest_error():
    with pytest.raises(k8s.ManifestError, match=r"^parameter_server needs at least one ps task"):
        spec(num_ps=0)


def test_the_first_bad_setting_is_the_one_named():
    """The checks run in a fixed order: the flavor before the image, the image before the port."""
    with pytest.raises(k8s.ManifestError, match=r"^--k8s_flavor"):
        spec(flavor="helm", image="", port=0)
    with pytest.raises(k8s.ManifestError, match=r"^--image is required"):
        spec(image="", port=0)


def test_cluster_flags_in_the_train_args_are_refused():
    with pytest.raises(k8s.ManifestError, match=r"^--job_name=worker describes the cluster"):
        spec(train_args=[*TRAIN_ARGS, "--job_name=worker"])
