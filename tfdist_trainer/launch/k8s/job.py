"""What a job's manifests are built from: its settings, checked once, and the names every flavor uses."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from tfdist_trainer import errors
from tfdist_trainer.io import markers
from tfdist_trainer.launch.k8s.resources import ResourceError, Resources, role_resources
from tfdist_trainer.plan.cluster import (
    CHIEF,
    DISPATCHER,
    EVALUATOR,
    PS,
    WORKER,
    ClusterConfigError,
)
from tfdist_trainer.plan.task_layout import task_layout

FLAVORS = ("tfjob", "indexed", "jobset")
DEFAULT_PORT = 2222
#: terminationGracePeriodSeconds of every pod: SIGTERM to SIGKILL. A preempted ps holds its exit
#: up to --preemption_grace_s (25 s) while the chief saves after its current loop; this covers
#: that hold with margin (BUILD.md, Preemption, has the save times it was chosen from).
DEFAULT_GRACE_S = 60
#: Restarts a job may spend (TFJob runPolicy.backoffLimit, a Job's backoffLimit, JobSet
#: maxRestarts); also tfdist-launch's --backoff_limit default for a local run.
DEFAULT_BACKOFF_LIMIT = 5
#: The emitted pods' restart policy unless --restart_policy is given (a local run's is Never):
#: on Kubernetes a preempted or evicted task (exit 128-255) must come back.
DEFAULT_RESTART_POLICY = "ExitCode"
#: Every container's workingDir: relative --gin_file paths and --module names after `--` resolve
#: from it, as they do from the directory tfdist-launch runs in; BUILD.md's Dockerfile copies a
#: project there.
DEFAULT_WORKDIR = "/workspace"

CONTAINER = "tensorflow"  # the container the training operator injects TF_CONFIG into
#: What every container runs (the image's ENTRYPOINT is overridden): the package's console script.
TRAIN_COMMAND = "tfdist-train"
JOB_LABEL = "tfdist-trainer/job"
TYPE_LABEL = "tfdist-trainer/task-type"
TFJOB_REPLICA_TYPES = {CHIEF: "Chief", WORKER: "Worker", PS: "PS", EVALUATOR: "Evaluator"}
#: Exit codes Kubeflow's ExitCode policy treats as permanent (never retried): 1-127.
PERMANENT_EXIT_CODES = list(errors.PERMANENT_EXIT_CODES)
#: tfdist-train flags that describe the cluster; on Kubernetes TF_CONFIG does.
CLUSTER_FLAGS = (
    "job_name",
    "task_type",
    "task_index",
    "ps_hosts",
    "worker_hosts",
    "chief_host",
    "evaluator_host",
    "dispatcher_host",
)
_ORDER = (CHIEF, WORKER, PS, DISPATCHER, EVALUATOR)


class ManifestError(errors.ConfigError):
    """The manifest cannot be built from these settings; the message names the fix."""


def dns_label(text: str, max_len: int = 40) -> str:
    """`text` as an RFC 1123 label (lower case, digits, '-'), short enough for '<name>-evaluator-0'."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    label = re.sub(r"-{2,}", "-", label)[:max_len].strip("-")
    if not label or not label[0].isalpha():
        label = f"job-{label}".strip("-")[:max_len]
    return label


def check_image(image: str | None) -> None:
    """Every pod runs `image`: there is no default."""
    if not image:
        raise ManifestError(
            "--image is required with --emit=k8s; name an image that has tfdist_trainer, your "
            "Trainer and your gin files installed."
        )


def check_train_args(train_args: Sequence[str]) -> None:
    """On Kubernetes the cluster comes from TF_CONFIG: cluster flags would contradict it."""
    for arg in train_args:
        if _flag_name(arg) in CLUSTER_FLAGS:
            raise ManifestError(
                f"{arg} describes the cluster, which on Kubernetes comes from TF_CONFIG; remove the "
                f"--job_name/--task_index/--*_hosts flags after '--'."
            )


def _flag_name(arg: str) -> str | None:
    """The name of a `--name` or `--name=value` argument; None for anything else (a value)."""
    return arg.lstrip("-").split("=", 1)[0] if arg.startswith("-") else None


def _seconds_flag(train_args: Sequence[str], name: str, default: float) -> float:
    """The last `--name=value` (or `--name value`) in `train_args` in seconds, else `default`."""
    value: float = default
    for i, arg in enumerate(train_args):
        if _flag_name(arg) != name:
            continue
        _, eq, text = arg.partition("=")
        if not eq:
            text = train_args[i + 1] if i + 1 < len(train_args) else ""
        try:
            value = float(text)
        except ValueError:
            raise ManifestError(f"{arg} after '--' is not a number of seconds.") from None
    return value


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A job's settings for its manifests, checked once when it is made: what every flavor builds from.

    Every mistake is one ManifestError naming the fix (a ConfigError: tfdist-launch's exit 2). The
    fields after `workdir` are derived from the others.

    Args:
      strategy_config: the job's strategies.StrategyConfig (from its gin files).
      name: the job's name; a DNS label (see `dns_label`).
      image: a container image with this package, the user's code and the gin files installed.
      train_args: the `tfdist-train` arguments, identical for every task.
      flavor: 'tfjob' (Kubeflow training operator), 'indexed' (plain Kubernetes Jobs) or 'jobset'.
      cpu, memory: every task's CPU request and memory request (= limit), e.g. '4', '8Gi'.
      resources: 'ROLE:cpu=N,memory=M' each, one role's values instead of `cpu`/`memory`.
      restart_policy: Never, OnFailure or ExitCode (Kubeflow's: only exit codes 128-255 are retried).
      grace_s: every pod's terminationGracePeriodSeconds; above the tasks' --preemption_grace_s.
      volume: 'CLAIM:/mount/path', a PersistentVolumeClaim mounted in every pod (the shared model_dir).
      workdir: the containers' workingDir, where relative --gin_file paths and --module names in
        `train_args` resolve; None or '': the image's own WORKDIR.
    """

    strategy_config: Any
    name: str
    image: str
    train_args: Sequence[str]
    flavor: str = "tfjob"
    num_workers: int = 2
    num_ps: int = 1
    evaluator: bool = False
    namespace: str | None = None
    cpu: str | None = None
    memory: str | None = None
    resources: Sequence[str] = ()
    gpus: int = 0
    port: int = DEFAULT_PORT
    restart_policy: str = DEFAULT_RESTART_POLICY
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    grace_s: int = DEFAULT_GRACE_S
    volume: str | None = None
    image_pull_policy: str | None = None
    workdir: str | None = DEFAULT_WORKDIR
    #: task type -> count, in start order (`task_layout`)
    layout: dict[str, int] = dataclasses.field(init=False, compare=False)
    #: task type -> its CPU and memory (`resources.role_resources`)
    role_resources: dict[str, Resources] = dataclasses.field(init=False, compare=False)
    #: (PersistentVolumeClaim, mount path) of the shared model_dir, or None
    mount: tuple[str, str] | None = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Sequences as tuples (the spec is immutable), no workdir as None.
        object.__setattr__(self, "train_args", tuple(self.train_args))
        object.__setattr__(self, "resources", tuple(self.resources))
        object.__setattr__(self, "workdir", self.workdir or None)
        self._check_settings()
        object.__setattr__(self, "mount", _mount(self.volume))
        if self.workdir and not self.workdir.startswith("/"):
            raise ManifestError(
                f"--k8s_workdir must be an absolute path in the image (e.g. {DEFAULT_WORKDIR}), "
                f"got {self.workdir!r}."
            )
        check_train_args(self.train_args)
        layout = _layout(self)
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "role_resources", _role_resources(self, layout))

    def _check_settings(self) -> None:
        if self.flavor not in FLAVORS:
            raise ManifestError(
                f"--k8s_flavor must be one of {', '.join(FLAVORS)}, got {self.flavor!r}."
            )
        check_image(self.image)
        if self.name != dns_label(self.name):
            raise ManifestError(
                f"job name {self.name!r} is not a DNS label of at most 40 characters; use e.g. "
                f"{dns_label(self.name)!r}."
            )
        if self.restart_policy not in ("Never", "OnFailure", "ExitCode"):
            raise ManifestError(
                f"restart policy must be Never, OnFailure or ExitCode, got {self.restart_policy!r}."
            )
        if not 0 < self.port < 65536:
            raise ManifestError(f"--k8s_port must be in 1..65535, got {self.port}.")
        if self.gpus < 0 or self.backoff_limit < 0:
            raise ManifestError("--gpus and --backoff_limit must be >= 0.")
        preemption_grace_s = _seconds_flag(
            self.train_args, "preemption_grace_s", markers.DEFAULT_PREEMPTION_GRACE_S
        )
        if self.grace_s <= preemption_grace_s:
            raise ManifestError(
                f"--k8s_grace_s ({self.grace_s}) must exceed the tasks' --preemption_grace_s "
                f"({preemption_grace_s:g}): a preempted ps holds its exit that long while the chief "
                f"saves, and the kubelet kills the pod at --k8s_grace_s; raise --k8s_grace_s."
            )


def _mount(volume: str | None) -> tuple[str, str] | None:
    if not volume:
        return None
    claim, _, path = volume.partition(":")
    if not claim or not path.startswith("/"):
        raise ManifestError(f"--k8s_volume must look like CLAIM:/mount/path, got {volume!r}.")
    return (claim, path)


def _layout(spec: JobSpec) -> dict[str, int]:
    try:
        return task_layout(
            spec.strategy_config,
            num_workers=spec.num_workers,
            num_ps=spec.num_ps,
            evaluator=spec.evaluator,
        )
    except ClusterConfigError as e:
        raise ManifestError(str(e)) from None


def _role_resources(spec: JobSpec, layout: dict[str, int]) -> dict[str, Resources]:
    try:
        return role_resources(
            layout,
            cpu=spec.cpu,
            memory=spec.memory,
            overrides=spec.resources,
            strategy_name=spec.strategy_config.name or "this",
        )
    except ResourceError as e:
        raise ManifestError(str(e)) from None
