"""Each role's CPU and memory: --cpu/--memory for every task, --k8s_resources=ROLE:... on top.

A recommender's ps need the memory (they hold the embedding tables) and its
workers the CPU (the input pipeline), so one size for every pod wastes one or
the other. ``--k8s_resources=ps:memory=64Gi`` changes the ps only; a key it
leaves out keeps the --cpu/--memory value. Every value is checked here, before
any manifest is written: the API server would refuse a bad quantity only at
``kubectl apply``, and ``memory=512m`` (0.512 bytes, a classic slip for 512Mi)
would be accepted and leave the pod unschedulable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from tfdist_trainer import errors
from tfdist_trainer.plan.cluster import CHIEF, DISPATCHER, EVALUATOR, PS, WORKER

#: Every role a job can have, in the order error messages list them.
ROLES = (CHIEF, WORKER, PS, EVALUATOR, DISPATCHER)
KEYS = ("cpu", "memory")
#: Kubernetes' quantity syntax (k8s.io/apimachinery resource.Quantity), without a sign: a number,
#: then a binary suffix (Ki..Ei), a decimal one (m, k, M..E), or a decimal exponent (e3).
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_EXAMPLE = {"cpu": "2 or 500m", "memory": "16Gi or 512Mi"}


class ResourceError(errors.ConfigError):
    """A --cpu, --memory or --k8s_resources value Kubernetes would not take; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Resources:
    """One role's CPU request and memory request (= limit); None: not set."""

    cpu: str | None = None
    memory: str | None = None


def check_quantity(key: str, value: str, flag: str) -> str:
    """`value` if it is a quantity Kubernetes takes for `key` (cpu or memory); else a ResourceError."""
    if not _QUANTITY.match(value):
        raise ResourceError(
            f"{flag}: {value!r} is not a Kubernetes quantity for {key}; use e.g. {_EXAMPLE[key]}."
        )
    if key == "memory" and value.endswith("m"):
        raise ResourceError(
            f"{flag}: memory {value} means {value[:-1]} thousandths of a byte; write "
            f"{value[:-1]}Mi (mebibytes)."
        )
    return value


def parse_override(text: str) -> tuple[str, dict[str, str]]:
    """'ps:cpu=2,memory=16Gi' -> ('ps', {'cpu': '2', 'memory': '16Gi'}), every value checked."""
    flag = f"--k8s_resources={text}"
    role, colon, pairs = text.partition(":")
    if not colon or not pairs:
        raise ResourceError(
            f"{flag} must look like ROLE:cpu=N,memory=M, e.g. ps:cpu=2,memory=16Gi."
        )
    if role not in ROLES:
        raise ResourceError(f"{flag}: {role!r} is not a role; use one of {', '.join(ROLES)}.")
    values: dict[str, str] = {}
    for pair in pairs.split(","):
        key, eq, value = pair.partition("=")
        if key not in KEYS or not eq:
            raise ResourceError(
                f"{flag}: {pair!r} is not cpu=N or memory=M; those are the two keys."
            )
        if key in values:
            raise ResourceError(f"{flag} gives {key} twice; give it once.")
        values[key] = check_quantity(key, value, flag)
    return role, values


def parse_resources(
    cpu: str | None = None, memory: str | None = None, overrides: Sequence[str] = ()
) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Every task's values and each role's, checked: ({'cpu': ..}, {'ps': {'memory': ..}}).

    Needs no strategy, so the launcher checks the flags before it reads the gin files.
    """
    base = {
        key: check_quantity(key, value, f"--{key}={value}")
        for key, value in (("cpu", cpu), ("memory", memory))
        if value
    }
    per_role: dict[str, dict[str, str]] = {}
    for text in overrides:
        role, values = parse_override(text)
        if role in per_role:
            raise ResourceError(f"--k8s_resources names {role} twice; give each role once.")
        per_role[role] = values
    return base, per_role


def role_resources(
    layout: Mapping[str, int],
    *,
    cpu: str | None = None,
    memory: str | None = None,
    overrides: Sequence[str] = (),
    strategy_name: str = "this",
) -> dict[str, Resources]:
    """Each task type of `layout` -> its Resources: `cpu`/`memory`, then the overrides of its role.

    An override for a role the job has no task of is refused: it would change nothing, and
    the user meant it to (an evaluator without --evaluator, a ps under multi_worker_mirrored).
    """
    base, per_role = parse_resources(cpu, memory, overrides)
    for role in per_role:
        if role not in layout:
            raise ResourceError(
                f"--k8s_resources names {role}, but a {strategy_name} job has no {role} task "
                f"(its roles: {', '.join(layout)})."
            )
    return {task_type: Resources(**{**base, **per_role.get(task_type, {})}) for task_type in layout}
