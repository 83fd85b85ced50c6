"""The building blocks every flavor shares: labels, metadata, the container, the pod, the NetworkPolicy,
and the Indexed Job of one task type (the indexed and jobset flavors)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfdist_trainer.launch.k8s.job import (
    CONTAINER,
    JOB_LABEL,
    PERMANENT_EXIT_CODES,
    TRAIN_COMMAND,
    TYPE_LABEL,
    JobSpec,
)
from tfdist_trainer.plan.cluster import DATA_WORKER_PORT_OFFSET, tf_config_text


def object_labels(name: str, task_type: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "tfdist-trainer",
        "app.kubernetes.io/instance": name,
        JOB_LABEL: name,
    }
    if task_type:
        labels[TYPE_LABEL] = task_type
    return labels


def object_metadata(name: str, namespace: str | None, labels: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    return meta


def pod_template(
    spec: JobSpec,
    task_type: str,
    *,
    env: Sequence[Mapping[str, Any]] = (),
    restart_policy: str | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod template of a task of `task_type`: its labels, its container, its grace period."""
    pod_extra = {"terminationGracePeriodSeconds": spec.grace_s, **(extra or {})}
    return {
        "metadata": {"labels": object_labels(spec.name, task_type)},
        "spec": pod_spec(
            container_for(spec, task_type, env),
            restart_policy=restart_policy,
            volume=spec.mount,
            extra=pod_extra,
        ),
    }


def container_resources(*, cpu: str | None, memory: str | None, gpus: int) -> dict[str, Any]:
    requests, limits = {}, {}
    if cpu:
        requests["cpu"] = str(cpu)  # no CPU limit: throttling slows every synchronous step
    if memory:
        requests["memory"] = limits["memory"] = str(memory)
    if gpus:
        limits["nvidia.com/gpu"] = int(gpus)
    resources = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def tfdist_container(
    *,
    image: str,
    train_args: Sequence[str],
    port: int,
    resources: Mapping[str, Any],
    env: Sequence[Mapping[str, Any]],
    volume: tuple[str, str] | None,
    image_pull_policy: str | None,
    workdir: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": CONTAINER, "image": image}
    if image_pull_policy:
        container["imagePullPolicy"] = image_pull_policy
    container["command"] = [TRAIN_COMMAND]
    container["args"] = list(train_args)
    if workdir:
        # Relative --gin_file paths and --module names in `args` resolve from here.
        container["workingDir"] = workdir
    container["env"] = [
        *env,
        {"name": "GRPC_FAIL_FAST", "value": "use_caller"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    container["ports"] = [{"name": "tfjob-port", "containerPort": port, "protocol": "TCP"}]
    if resources:
        container["resources"] = dict(resources)
    if volume:
        container["volumeMounts"] = [{"name": "model-dir", "mountPath": volume[1]}]
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    return container


def pod_spec(
    container: Mapping[str, Any],
    *,
    restart_policy: str | None,
    volume: tuple[str, str] | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    spec.update(extra or {})
    # The tasks never call the Kubernetes API: a task reached through its open gRPC port gets no token.
    spec["automountServiceAccountToken"] = False
    spec["containers"] = [dict(container)]
    if volume:
        spec["volumes"] = [{"name": "model-dir", "persistentVolumeClaim": {"claimName": volume[0]}}]
    return spec


def network_policy(
    name: str, namespace: str | None, port: int, *, data_port: bool = False
) -> dict[str, Any]:
    """Admits traffic to the job's pods only from pods of the same job, on the gRPC port.

    `data_port`: also on the port after it, where a parameter_server worker's
    tf.data worker listens (parameter_server.data_service).
    """
    same_job = {"matchLabels": {JOB_LABEL: name}}
    ports = [port, port + DATA_WORKER_PORT_OFFSET] if data_port else [port]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_metadata(f"{name}-same-job-only", namespace, object_labels(name)),
        "spec": {
            "podSelector": same_job,
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": same_job}],
                    "ports": [{"protocol": "TCP", "port": p} for p in ports],
                }
            ],
        },
    }


def container_for(
    spec: JobSpec, task_type: str, env: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The tfdist-train container of a task of `task_type` (GPUs only where the strategy runs steps)."""
    gpu = spec.gpus if spec.strategy_config.runs_steps(task_type) else 0
    own = spec.role_resources[task_type]
    return tfdist_container(
        image=spec.image,
        train_args=spec.train_args,
        port=spec.port,
        env=env,
        volume=spec.mount,
        resources=container_resources(cpu=own.cpu, memory=own.memory, gpus=gpu),
        image_pull_policy=spec.image_pull_policy,
        workdir=spec.workdir,
    )


def completion_index_tf_config(
    cluster: Mapping[str, Sequence[str]], task_type: str
) -> list[dict[str, Any]]:
    """TF_CONFIG of the pod of an Indexed Job, from its completion index; no shell in the image.

    TASK_INDEX comes from the downward API annotation the Job controller sets and
    must come before TF_CONFIG, because Kubernetes expands ``$(VAR)`` only for
    variables defined earlier (the JOB_COMPLETION_INDEX it adds is appended last).
    A job of one task needs no TF_CONFIG at all.
    """
    if sum(len(addresses) for addresses in cluster.values()) <= 1:
        return []
    return [
        {
            "name": "TASK_INDEX",
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                }
            },
        },
        {"name": "TF_CONFIG", "value": tf_config_text(cluster, task_type, "$(TASK_INDEX)")},
    ]


def indexed_job_spec(
    spec: JobSpec,
    task_type: str,
    *,
    env: Sequence[Mapping[str, Any]],
    retries: int,
    per_index: bool,
    pod_restart: str,
    pod_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec of an Indexed Job that runs every task of `task_type`, one pod per task index.

    Args:
      retries: how often the Job re-creates a failed pod before it fails (its backoffLimit).
      per_index: each index has its own `retries` (backoffLimitPerIndex, Kubernetes >= 1.29),
        and a permanent exit code fails that index only: one failing task never takes the
        others down. Otherwise a permanent exit code fails the whole Job at once.
      pod_restart: the pods' restartPolicy; Never wherever a pod failure policy or a per-index
        budget applies (Kubernetes requires it).
    """
    job: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.layout[task_type],
        "parallelism": spec.layout[task_type],
    }
    job["backoffLimitPerIndex" if per_index else "backoffLimit"] = retries
    if spec.restart_policy == "ExitCode":
        # A pod failure policy needs pods that never restart in place (restartPolicy Never).
        job["podFailurePolicy"] = {
            "rules": [
                # A pod evicted or preempted by Kubernetes (it saved on SIGTERM) is re-created
                # without spending the retry budget: the failure was not the task's.
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
                {
                    "action": "FailIndex" if per_index else "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "In",
                        "values": PERMANENT_EXIT_CODES,
                    },
                },
            ]
        }
    job["template"] = pod_template(
        spec, task_type, env=env, restart_policy=pod_restart, extra=pod_extra
    )
    return job
