"""Kubernetes manifests for a job: a Kubeflow TFJob, plain Indexed Jobs, or a JobSet.

    tfdist-launch --emit=k8s --image=registry/my-trainer:1 [--k8s_flavor=tfjob|indexed|jobset] \\
        --num_workers=2 --num_ps=1 --evaluator -- --gin_file=configs/mnist.gin \\
        --gin_file=configs/strategies/parameter_server.gin --model_dir=/shared/run1

The strategy read from the same gin files decides which task types exist,
exactly as for a local launch (`task_layout`). Every pod runs the same
``tfdist-train`` command with the same arguments; only TF_CONFIG differs:

* ``tfjob``: the training operator injects TF_CONFIG into the container named
  ``tensorflow`` (one replica spec per task type: Chief, Worker, PS,
  Evaluator), restartPolicy ExitCode by default; under parameter_server the
  workers get OnFailure, because the operator fails the whole TFJob when a
  replica's pod fails and a lost worker must not end the job.
* ``indexed``: one ``batch/v1`` Job per task type with ``completionMode:
  Indexed``, and a headless Service whose name is every pod's ``subdomain``,
  so that task i of type t answers at ``<name>-<t>-<i>.<name>``. TF_CONFIG is
  an env var built from the pod's completion index (the downward API
  annotation ``batch.kubernetes.io/job-completion-index``, expanded with
  Kubernetes' ``$(VAR)`` syntax); no shell in the image is needed. Under
  parameter_server the worker Job retries per index (``backoffLimitPerIndex``,
  Kubernetes >= 1.29), so one failing worker never takes the others down.
* ``jobset``: one JobSet (kubernetes-sigs/jobset >= v0.8) with a replicated Job
  per task type, DNS hostnames, TF_CONFIG from the pods' stable names, and
  set-level success and failure policies (see `jobset`).

Every pod's terminationGracePeriodSeconds is ``--k8s_grace_s``: a preempted
task saves (or waits for the chief's save) between SIGTERM and SIGKILL.
Every container's workingDir is ``--k8s_workdir`` (/workspace): the pods
resolve relative gin paths and modules there, as a local launch does in its
current directory. ``--cpu``/``--memory`` size every task and
``--k8s_resources=ROLE:cpu=N,memory=M`` one role (`resources`).

Both add a NetworkPolicy that admits traffic to the job's pods only from
pods of the same job, on the gRPC port: TensorFlow's servers have no
authentication (see BUILD.md, Security).

The output is YAML written by PyYAML (a runtime dependency: block style, keys
in the order built, no anchors; a string that PyYAML or Kubernetes' Go parser
would read as a number or a boolean is quoted), or JSON (a ``v1 List``).

One module per flavor (`tfjob`, `indexed`, `jobset`), each building from one `JobSpec` (`job`:
the settings, checked once when it is made); `objects` builds what every flavor shares, `output`
writes the text.
"""

from __future__ import annotations

from typing import Any

from tfdist_trainer.launch.k8s.image import image_path_notes
from tfdist_trainer.launch.k8s.indexed import indexed_manifests, task_address
from tfdist_trainer.launch.k8s.job import (
    CONTAINER,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_GRACE_S,
    DEFAULT_PORT,
    DEFAULT_RESTART_POLICY,
    DEFAULT_WORKDIR,
    FLAVORS,
    JOB_LABEL,
    PERMANENT_EXIT_CODES,
    TRAIN_COMMAND,
    TYPE_LABEL,
    JobSpec,
    ManifestError,
    check_image,
    check_train_args,
    dns_label,
)
from tfdist_trainer.launch.k8s.jobset import jobset_manifests, jobset_task_address
from tfdist_trainer.launch.k8s.objects import network_policy
from tfdist_trainer.launch.k8s.output import to_json, to_yaml
from tfdist_trainer.launch.k8s.resources import ROLES, ResourceError, parse_resources
from tfdist_trainer.launch.k8s.tfjob import tfjob_manifests
from tfdist_trainer.plan.task_layout import task_layout

__all__ = [
    "CONTAINER",
    "DEFAULT_BACKOFF_LIMIT",
    "DEFAULT_GRACE_S",
    "DEFAULT_PORT",
    "DEFAULT_RESTART_POLICY",
    "DEFAULT_WORKDIR",
    "FLAVORS",
    "JOB_LABEL",
    "PERMANENT_EXIT_CODES",
    "ROLES",
    "ResourceError",
    "TRAIN_COMMAND",
    "TYPE_LABEL",
    "JobSpec",
    "ManifestError",
    "check_image",
    "check_train_args",
    "dns_label",
    "image_path_notes",
    "jobset_task_address",
    "manifests",
    "network_policy",
    "parse_resources",
    "task_address",
    "task_layout",
    "to_json",
    "to_yaml",
]

#: Each flavor's builder: a checked JobSpec in, the objects to apply out.
_BUILDERS = {"tfjob": tfjob_manifests, "indexed": indexed_manifests, "jobset": jobset_manifests}


def manifests(spec: JobSpec) -> list[dict[str, Any]]:
    """The Kubernetes objects of one job (its settings checked once, as a `JobSpec`), in the order
    to apply them."""
    return _BUILDERS[spec.flavor](spec)
