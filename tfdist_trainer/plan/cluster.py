"""The cluster a task belongs to: read from TF_CONFIG or classic flags, checked before TF starts.

TensorFlow accepts many broken cluster descriptions silently (an index out of
range, a missing peer, a port in use) and then fails late with an unhelpful
message or waits forever. Everything here runs *before* TensorFlow is imported
so that each user mistake ends in one sentence that names the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence

from tfdist_trainer.errors import ClusterConfigError  # noqa: F401  (re-exported)

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
#: The tf.data service dispatcher of a parameter_server job with `parameter_server.data_service`.
DISPATCHER = "dispatcher"
KNOWN_TASK_TYPES = (CHIEF, WORKER, PS, EVALUATOR, DISPATCHER)
#: A parameter_server worker's tf.data worker (data_service) listens on the worker's port + this:
#: a restarted worker must come back at the same address, where the dispatcher resumes its tasks.
DATA_WORKER_PORT_OFFSET = 1
#: Tasks that are not part of TensorFlow's own cluster (they run no TF server).
SIDE_TASK_TYPES = (EVALUATOR, DISPATCHER)

# Kubeflow and older Estimator jobs spell some roles differently.
_TASK_TYPE_ALIASES = {"master": CHIEF}


@dataclasses.dataclass(frozen=True)
class TaskAddress:
    """One task of the cluster and where it listens."""

    task_type: str
    task_id: int
    address: str

    @property
    def name(self) -> str:
        return f"{self.task_type}:{self.task_id}"

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster and the task this process plays in it.

    An empty `cluster` means a lone process (no TF_CONFIG, no flags).
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str | None = None
    task_id: int = 0
    rpc_layer: str = "grpc"
    environment: str | None = None

    # -- roles ---------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return not self.cluster

    @property
    def role(self) -> str:
        """The log prefix of this task, e.g. ``worker:1`` or ``local``."""
        if self.is_local or self.task_type is None:
            return "local"
        return f"{self.task_type}:{self.task_id}"

    def num_tasks(self, task_type: str) -> int:
        return len(self.cluster.get(task_type, ()))

    @property
    def is_chief(self) -> bool:
        """The task that writes checkpoints and summaries (TF's own rule)."""
        if self.is_local:
            return True
        if CHIEF in self.cluster:
            return self.task_type == CHIEF
        return self.task_type == WORKER and self.task_id == 0

    def tasks(self, task_types: Iterable[str] | None = None) -> list[TaskAddress]:
        wanted = tuple(task_types) if task_types is not None else tuple(self.cluster)
        return [
            TaskAddress(t, i, addr)
            for t in wanted
            for i, addr in enumerate(self.cluster.get(t, ()))
        ]

    @property
    def own_address(self) -> TaskAddress | None:
        if self.is_local or self.task_type is None:
            return None
        return TaskAddress(self.task_type, self.task_id, self.cluster[self.task_type][self.task_id])

    # -- conversions ---------------------------------------------------------
    def training_cluster(self) -> dict[str, list[str]]:
        """The cluster without the evaluator and the dispatcher, which must not be part of it.

        A parameter-server coordinator that sees an evaluator tries to reach it
        as a worker (tensorflow/tensorflow#46169); the evaluator is a side-car.
        The tf.data dispatcher speaks its own protocol, not TF's.
        """
        return {t: list(a) for t, a in self.cluster.items() if t not in SIDE_TASK_TYPES}

    @property
    def data_worker_address(self) -> str | None:
        """Where this worker's tf.data worker listens (parameter_server.data_service)."""
        own = self.own_address
        if own is None or self.dispatcher_address is None or own.task_type != WORKER:
            return None
        return f"{own.host}:{own.port + DATA_WORKER_PORT_OFFSET}"

    @property
    def dispatcher_address(self) -> str | None:
        """Where the tf.data service dispatcher listens, when the job has one."""
        addresses = self.cluster.get(DISPATCHER, ())
        return addresses[0] if addresses else None

    def to_tf_config(self) -> str:
        """TF_CONFIG as TensorFlow expects it: normalized, evaluator removed for trainers.

        Empty for a dispatcher, which is no task of TensorFlow's cluster.
        """
        if self.is_local or self.task_type == DISPATCHER:
            return ""
        cluster = (
            self.training_cluster()
            if self.task_type != EVALUATOR
            else {t: list(a) for t, a in self.cluster.items()}
        )
        return tf_config_text(
            cluster,
            self.task_type,
            self.task_id,
            rpc_layer=self.rpc_layer,
            environment=self.environment,
        )


#: Stands for a task index that is not a number yet (a Kubernetes "$(TASK_INDEX)").
_INDEX_PLACEHOLDER = "__tfdist_task_index__"


def tf_config_text(
    cluster: Mapping[str, Sequence[str]],
    task_type: str,
    index: int | str,
    *,
    rpc_layer: str | None = None,
    environment: str | None = None,
) -> str:
    """The TF_CONFIG JSON of one task of `cluster`, the one place that writes it.

    `cluster` is written as given (an evaluator stays in it, as Kubeflow's
    TFJob writes it; `ClusterConfig.to_tf_config` removes it for TensorFlow).
    `index` may be a string such as ``$(TASK_INDEX)`` that a later step
    expands; it is written unquoted, where the number goes.
    """
    task = {"type": task_type, "index": index if isinstance(index, int) else _INDEX_PLACEHOLDER}
    config: dict = {"cluster": {t: list(a) for t, a in cluster.items()}, "task": task}
    if rpc_layer is not None:
        config["rpc_layer"] = rpc_layer
    if environment:
        config["environment"] = environment
    text = json.dumps(config)
    if not isinstance(index, int):
        text = text.replace(json.dumps(_INDEX_PLACEHOLDER), index)
    return text


# -- parsing -----------------------------------------------------------------


def _normalize_type(task_type: str, where: str) -> str:
    if not isinstance(task_type, str) or not task_type:
        raise ClusterConfigError(f"{where}: task type {task_type!r} must be a non-empty string.")
    lowered = task_type.lower()
    lowered = _TASK_TYPE_ALIASES.get(lowered, lowered)
    if lowered not in KNOWN_TASK_TYPES:
        raise ClusterConfigError(
            f"{where}: unknown task type {task_type!r}; use one of {', '.join(KNOWN_TASK_TYPES)}."
        )
    return lowered


def _check_address(address: object, where: str) -> str:
    if not isinstance(address, str) or ":" not in address:
        raise ClusterConfigError(f"{where}: address {address!r} must look like host:port.")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterConfigError(
            f"{where}: address {address!r} must look like host:port with a port in 1..65535."
        )
    return address


def _validated(
    cluster: Mapping[str, Sequence[str]],
    task_type: str | None,
    task_id: int,
    rpc_layer: str,
    environment: str | None,
    where: str,
) -> ClusterConfig:
    """The ClusterConfig of `cluster` and this task, every mistake one sentence that starts with
    `where` (what the user wrote it in: TF_CONFIG, the cluster flags)."""
    normalized = _normalized_cluster(cluster, where)
    _check_single_roles(normalized, where)
    _check_unique_addresses(normalized, where)
    if normalized:
        task_type = _checked_task(normalized, task_type, task_id, where)
    elif task_type is not None:
        raise ClusterConfigError(
            f"{where}: task type {task_type!r} is set but the cluster is empty."
        )
    if rpc_layer not in ("grpc", "grpc+verbs", "grpc+mpi", ""):
        raise ClusterConfigError(f"{where}: rpc_layer {rpc_layer!r} is not supported; use 'grpc'.")
    return ClusterConfig(
        cluster=normalized,
        task_type=task_type,
        task_id=task_id,
        rpc_layer=rpc_layer or "grpc",
        environment=environment,
    )


def _normalized_cluster(
    cluster: Mapping[str, Sequence[str]], where: str
) -> dict[str, tuple[str, ...]]:
    """`cluster` with TensorFlow's task type names ('master' is 'chief') and checked host:port
    tuples; a type named twice under two spellings is refused rather than one silently lost."""
    normalized: dict[str, tuple[str, ...]] = {}
    for raw_type, addresses in cluster.items():
        t = _normalize_type(raw_type, where)
        if t in normalized:  # e.g. both "master" and "chief": one would silently replace the other
            raise ClusterConfigError(
                f"{where}: the cluster names the {t} twice ({', '.join(repr(r) for r in cluster if _normalize_type(r, where) == t)}); "
                f"'master' is the old name of 'chief': keep one of them."
            )
        if isinstance(addresses, str):
            addresses = [addresses]
        if not isinstance(addresses, (list, tuple)) or not addresses:
            raise ClusterConfigError(
                f"{where}: cluster[{raw_type!r}] must be a non-empty list of host:port."
            )
        normalized[t] = tuple(_check_address(a, f"{where} {t}") for a in addresses)
    return normalized


def _check_single_roles(normalized: Mapping[str, tuple[str, ...]], where: str) -> None:
    """One chief at most (TensorFlow's rule), one evaluator and one dispatcher at most."""
    if normalized.get(CHIEF) and len(normalized[CHIEF]) != 1:
        raise ClusterConfigError(
            f"{where}: a cluster has exactly one chief, got {len(normalized[CHIEF])}."
        )
    # Two evaluators would evaluate every checkpoint twice and both write eval/metrics.jsonl;
    # two dispatchers would each hand out the whole epoch.
    for single in (EVALUATOR, DISPATCHER):
        if len(normalized.get(single, ())) > 1:
            raise ClusterConfigError(
                f"{where}: a cluster has at most one {single}, got {len(normalized[single])}; "
                f"list one address under '{single}'."
            )


def _check_unique_addresses(normalized: Mapping[str, tuple[str, ...]], where: str) -> None:
    """Every task its own address: a second task on one cannot bind its port, and fails late."""
    seen: dict[str, str] = {}
    for t, addresses in normalized.items():
        for i, a in enumerate(addresses):
            if a in seen:
                raise ClusterConfigError(
                    f"{where}: {t}:{i} and {seen[a]} both use address {a}; give each task its own port."
                )
            seen[a] = f"{t}:{i}"


def _checked_task(
    normalized: Mapping[str, tuple[str, ...]], task_type: str | None, task_id: int, where: str
) -> str:
    """This task's normalized type, which with `task_id` must name a task of the cluster."""
    if task_type is None:
        raise ClusterConfigError(
            f"{where}: the cluster is set but this task's type is not; set task.type (or --job_name)."
        )
    task_type = _normalize_type(task_type, where)
    if task_type not in normalized:
        raise ClusterConfigError(
            f"{where}: task type {task_type!r} is not in the cluster (which has {', '.join(normalized)}); "
            f"add it to the cluster or fix the task type."
        )
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        raise ClusterConfigError(f"{where}: task index {task_id!r} must be an integer.")
    count = len(normalized[task_type])
    if not 0 <= task_id < count:
        raise ClusterConfigError(
            f"{where}: task index {task_id} is out of range for {task_type!r}, which has {count} "
            f"task{'s' if count != 1 else ''} (valid: 0..{count - 1})."
        )
    return task_type


def from_tf_config(text: str) -> ClusterConfig:
    """Parses TF_CONFIG, including the Kubeflow TFJob form (lower-case types, environment: cloud)."""
    where = "TF_CONFIG"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({e.msg} at position {e.pos}); fix the TF_CONFIG environment variable."
        ) from None
    if not isinstance(config, dict):
        raise ClusterConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'.")
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise ClusterConfigError(
            "TF_CONFIG: 'cluster' must be an object mapping task types to address lists."
        )
    task = config.get("task") or {}
    if not isinstance(task, dict):
        raise ClusterConfigError("TF_CONFIG: 'task' must be an object with 'type' and 'index'.")
    index = task.get("index", 0)
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    return _validated(
        cluster,
        task.get("type"),
        index,
        config.get("rpc_layer", "grpc"),
        config.get("environment"),
        where,
    )


def _split_hosts(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        value = [value]
    return [h.strip() for item in value for h in item.split(",") if h.strip()]


def from_flags(
    *,
    job_name: str | None,
    task_index: int = 0,
    ps_hosts=None,
    worker_hosts=None,
    chief_host=None,
    evaluator_host=None,
    dispatcher_host=None,
) -> ClusterConfig:
    """Builds the cluster from the classic per-task flags (``--job_name=ps --task_index=0 ...``)."""
    cluster = {}
    for task_type, hosts in (
        (CHIEF, chief_host),
        (WORKER, worker_hosts),
        (PS, ps_hosts),
        (EVALUATOR, evaluator_host),
        (DISPATCHER, dispatcher_host),
    ):
        hosts = _split_hosts(hosts)
        if hosts:
            cluster[task_type] = hosts
    return _validated(cluster, job_name or None, task_index, "grpc", None, "cluster flags")


def resolve(
    environ: Mapping[str, str], *, job_name: str | None = None, **flag_values
) -> ClusterConfig:
    """The cluster from flags when ``--job_name`` is given, else from TF_CONFIG, else a lone process."""
    has_hosts = any(_split_hosts(v) for v in flag_values.values() if not isinstance(v, int))
    if job_name or has_hosts:
        if not job_name:
            raise ClusterConfigError(
                "cluster flags: --*_hosts are set but --job_name is not; add --job_name (and --task_index)."
            )
        return from_flags(job_name=job_name, **flag_values)
    text = environ.get("TF_CONFIG", "").strip()
    if text:
        return from_tf_config(text)
    return ClusterConfig(cluster={})
