"""The indexed flavor: plain Kubernetes, one Indexed Job per task type and a headless Service.

One ``batch/v1`` Job per task type with ``completionMode: Indexed``, and a
headless Service whose name is every pod's ``subdomain``, so that task i of
type t answers at ``<name>-<t>-<i>.<name>``. TF_CONFIG is an env var built
from the pod's completion index (`objects.completion_index_tf_config`). Each
Job retries its own pods (``backoffLimit``); under parameter_server the worker
Job retries per index (``backoffLimitPerIndex``, Kubernetes >= 1.29), so one
failing worker never takes the others down. Nothing restarts the other task
types when one fails for good: that is what the jobset flavor adds.
"""

from __future__ import annotations

from typing import Any

from tfdist_trainer.launch.k8s.job import JOB_LABEL, JobSpec
from tfdist_trainer.launch.k8s.objects import (
    completion_index_tf_config,
    indexed_job_spec,
    network_policy,
    object_labels,
    object_metadata,
)


def task_address(
    name: str, task_type: str, index: int, port: int, namespace: str | None = None
) -> str:
    """Where task `index` of `task_type` listens under the indexed flavor (hostname.subdomain:port)."""
    host = f"{name}-{task_type}-{index}.{name}"
    return f"{host}.{namespace}.svc:{port}" if namespace else f"{host}:{port}"


def indexed_manifests(spec: JobSpec) -> list[dict[str, Any]]:
    """The Service, one Indexed Job per task type, and the NetworkPolicy, in the order to apply them."""
    cluster = {
        t: [task_address(spec.name, t, i, spec.port, spec.namespace) for i in range(n)]
        for t, n in spec.layout.items()
    }
    return [
        _headless_service(spec),
        *(_indexed_job(spec, task_type, cluster) for task_type in spec.layout),
        network_policy(
            spec.name,
            spec.namespace,
            spec.port,
            data_port=spec.strategy_config.data_service,
        ),
    ]


def _headless_service(spec: JobSpec) -> dict[str, Any]:
    """The headless Service every pod names as its subdomain: the tasks' stable DNS names."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(spec.name, spec.namespace, object_labels(spec.name)),
        "spec": {
            "clusterIP": "None",
            # Tasks must resolve each other while they start, before any of them is 'ready'.
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: spec.name},
            "ports": [
                {"name": "grpc", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"}
            ],
        },
    }


def _indexed_job(spec: JobSpec, task_type: str, cluster: dict[str, list[str]]) -> dict[str, Any]:
    """The Indexed Job of one task type, which retries its own pods."""
    retries = 0 if spec.restart_policy == "Never" else spec.backoff_limit
    # Each index of a task the strategy can lose has its own retry budget: a Job that runs
    # out of a shared backoffLimit kills all its pods, so one failing worker would take
    # every other worker with it (and a per-index budget needs pods that never restart).
    per_index = spec.strategy_config.survives_loss_of(task_type)
    pod_restart = "OnFailure" if spec.restart_policy == "OnFailure" and not per_index else "Never"
    job_spec = indexed_job_spec(
        spec,
        task_type,
        env=completion_index_tf_config(cluster, task_type),
        retries=retries,
        per_index=per_index,
        pod_restart=pod_restart,
        pod_extra={"subdomain": spec.name},
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(
            f"{spec.name}-{task_type}", spec.namespace, object_labels(spec.name, task_type)
        ),
        "spec": job_spec,
    }
