"""The jobset flavor: one JobSet (kubernetes-sigs/jobset, ``jobset.x-k8s.io/v1alpha2``).

JobSet is Kubernetes' own answer for jobs with several roles, now that Kubeflow's
Trainer v2 has no TensorFlow runtime. What it gives over the indexed flavor is a
set-level policy; what it lacks (its TensorFlow example sets no TF_CONFIG) this
module writes:

* one replicated Job per task type (one Indexed Job, one pod per task index),
  with DNS hostnames on: task i of type t answers at
  ``<name>-<t>-0-<i>.<name>`` (JobSet's ``<jobset>-<replicatedJob>-<jobIndex>-
  <podIndex>.<subdomain>``), and TF_CONFIG comes from the pod's completion
  index, written by the one TF_CONFIG writer (`plan.cluster.tf_config_text`);
* ``successPolicy``: the set completes when every task that finishes by itself
  has finished (the chief, multi_worker_mirrored's workers, and the evaluator,
  which ends right after it has evaluated and exported the final checkpoint);
  ps and parameter_server workers serve until the chief marks training done
  and do not hold the set open (what still runs is removed with it);
* ``failurePolicy``: a task the strategy cannot lose fails its Job at once and
  the set is re-created from the last checkpoint (lock-step multi_worker_mirrored
  workers cannot go on alone; a parameter_server chief restores its ps), at most
  ``--backoff_limit`` times (``maxRestarts``; ``BlockingRecreate``: no new task
  starts while one from the previous attempt still writes to model_dir). Under
  ``ExitCode`` a permanent exit code (1-127, a mistake a restart cannot mend)
  fails the set at once: the Jobs' ``podFailurePolicy`` fails the Job with reason
  ``PodFailurePolicy``, which the set's first rule turns into ``FailJobSet``.
  A parameter_server worker Job retries each worker on its own
  (``backoffLimitPerIndex``) and the evaluator Job retries its pod, so neither
  restarts the training;
* ``dependsOn``: a parameter_server chief starts once its ps and workers run (it
  waits for them only up to its start-up timeout, and a chief that gives up
  would restart the whole set).
"""

from __future__ import annotations

from typing import Any

from tfdist_trainer.launch.k8s.job import JobSpec
from tfdist_trainer.launch.k8s.objects import (
    completion_index_tf_config,
    indexed_job_spec,
    network_policy,
    object_labels,
    object_metadata,
)
from tfdist_trainer.plan.cluster import CHIEF, DISPATCHER, EVALUATOR, PS, WORKER

API_VERSION = "jobset.x-k8s.io/v1alpha2"
#: Replicated Jobs in the order JobSet creates them (a dependsOn names an earlier one).
_ORDER = (PS, DISPATCHER, WORKER, CHIEF, EVALUATOR)
#: The failure policy rule that fails the set on a permanent exit code (JobSet's name syntax).
PERMANENT_RULE = "permanentExitCode"


def jobset_task_address(
    name: str, task_type: str, index: int, port: int, namespace: str | None = None
) -> str:
    """Where task `index` of `task_type` listens: JobSet's stable pod hostname in its subdomain."""
    host = f"{name}-{task_type}-0-{index}.{name}"
    return f"{host}.{namespace}.svc:{port}" if namespace else f"{host}:{port}"


def _failure_policy(spec: JobSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "maxRestarts": 0 if spec.restart_policy == "Never" else spec.backoff_limit,
        "restartStrategy": "BlockingRecreate",
    }
    if spec.restart_policy == "ExitCode":
        policy["rules"] = [
            {
                "name": PERMANENT_RULE,
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ]
    return policy


def _depends_on(spec: JobSpec, task_type: str, earlier: list[str]) -> list[dict[str, str]]:
    if task_type != CHIEF or PS not in spec.layout:
        return []
    # The tasks the chief waits for (strategy.peers) run before it starts.
    return [{"name": t, "status": "Ready"} for t in earlier if t in (PS, DISPATCHER, WORKER)]


def jobset_manifests(spec: JobSpec) -> list[dict[str, Any]]:
    """The JobSet of the job and its NetworkPolicy, in the order to apply them."""
    strategy = spec.strategy_config
    task_types = [t for t in _ORDER if t in spec.layout]
    cluster = {
        t: [jobset_task_address(spec.name, t, i, spec.port, spec.namespace) for i in range(n)]
        for t, n in spec.layout.items()
    }
    replicated_jobs = [
        _replicated_job(spec, task_type, cluster, earlier=task_types[:position])
        for position, task_type in enumerate(task_types)
    ]
    jobset = {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": object_metadata(spec.name, spec.namespace, object_labels(spec.name)),
        "spec": {
            "network": {
                "enableDNSHostnames": True,
                "subdomain": spec.name,
                # Tasks resolve each other while they start, before any of them is 'ready'.
                "publishNotReadyAddresses": True,
            },
            "successPolicy": {
                "operator": "All",
                "targetReplicatedJobs": [t for t in task_types if not strategy.serves(t)],
            },
            "failurePolicy": _failure_policy(spec),
            "replicatedJobs": replicated_jobs,
        },
    }
    return [
        jobset,
        network_policy(
            spec.name,
            spec.namespace,
            spec.port,
            data_port=spec.strategy_config.data_service,
        ),
    ]


def _replicated_job(
    spec: JobSpec, task_type: str, cluster: dict[str, list[str]], *, earlier: list[str]
) -> dict[str, Any]:
    """The replicated Job of one task type (one Indexed Job, one pod per task), after the
    `earlier` ones; only a task the strategy can lose (or the evaluator) retries on its own."""
    retries = 0 if spec.restart_policy == "Never" else spec.backoff_limit
    losable = spec.strategy_config.survives_loss_of(task_type)
    job_spec = indexed_job_spec(
        spec,
        task_type,
        env=completion_index_tf_config(cluster, task_type),
        # A task the job cannot lose fails its Job at once: the set restarts as a whole.
        retries=retries if losable or task_type == EVALUATOR else 0,
        per_index=losable,
        pod_restart="Never",
    )
    replicated: dict[str, Any] = {
        "name": task_type,
        "replicas": 1,
        "template": {
            "metadata": {"labels": object_labels(spec.name, task_type)},
            "spec": job_spec,
        },
    }
    depends_on = _depends_on(spec, task_type, earlier)
    if depends_on:
        replicated["dependsOn"] = depends_on
    return replicated
