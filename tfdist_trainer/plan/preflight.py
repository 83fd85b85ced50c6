"""The one preflight of every entry point: model_dir, gin, strategy and cluster, checked before TF.

`tfdist-train` (a task, or `--mode=evaluate/export`), `tfdist_trainer.train/evaluate/export`,
`tfdist-launch` and `tfdist-launch --emit=k8s` all call `prepare`; they differ only in their
`EntryPoint`: what they call the model_dir, who shares it, and whether they train in this one
process. Every mistake is one sentence raised as a ConfigError (the entry points' exit 2), before
anything is created.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.io import model_dir as model_dir_lib
from tfdist_trainer.plan import cluster as cluster_lib
from tfdist_trainer.plan.strategies import Action


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    """How one entry point names, requires and checks its model_dir (the wording of its sentences)."""

    #: what the setting is called in a sentence: '--model_dir' or 'model_dir'
    name: str = "--model_dir"
    #: the sentence for an unset model_dir; None: `model_dir.check`'s own
    missing: str | None = None
    #: completes "..., but {shared_by}." for an in-memory model_dir when several processes share it
    #: (a task of a local cluster needs none); None: one process, ram:// is fine
    shared_by: str | None = None
    #: False: model_dir is only required, not looked at from here (--emit: the pods' storage)
    local: bool = True
    #: the ConfigError kind a bad model_dir raises
    error: type[ConfigError] = ConfigError
    #: the Python function that trains in this one process: a TF_CONFIG cluster, or a strategy of
    #: several processes, is refused in its name
    one_process: str | None = None


#: a task of `tfdist-train` (its cluster given to `prepare`)
TRAIN_TASK = EntryPoint(
    shared_by="the tasks of a cluster must share it; use a path every task sees, or gs://, s3:// or "
    "file://",
    error=cluster_lib.ClusterConfigError,
)
#: `tfdist-train --mode=evaluate/export`: one checkpoint in this process
CHECKPOINT_TASK = EntryPoint()
LAUNCH = EntryPoint(
    missing="--model_dir is required after '--' (the tasks share it); e.g. -- --model_dir=/tmp/run1.",
    shared_by="tfdist-launch runs each task in its own; use a path, file://, gs:// or s3://",
)
EMIT = EntryPoint(
    missing="--model_dir is required after '--' (every pod needs the same shared one, e.g. "
    "gs://bucket/run1 or a path on --k8s_volume).",
    local=False,
)
TRAIN_API = EntryPoint(
    name="model_dir",
    missing="tfdist_trainer.train needs model_dir=..., a directory for this run.",
    one_process="tfdist_trainer.train",
)
EVALUATE_API = EntryPoint(
    name="model_dir",
    missing="tfdist_trainer.evaluate needs model_dir=..., the run whose checkpoint to read.",
)
EXPORT_API = EntryPoint(
    name="model_dir",
    missing="tfdist_trainer.export needs model_dir=..., the run whose checkpoint to read.",
)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What an entry point runs, checked: its model_dir, experiment, and (for a task) cluster and action."""

    entry: EntryPoint
    model_dir: str
    #: the gin-configured plan.experiment.Experiment
    experiment: Any
    #: the task's cluster, validated against the strategy; None where the entry point has none
    cluster: cluster_lib.ClusterConfig | None = None
    #: what the task does under its strategy; None without a cluster
    action: Action | None = None

    @property
    def strategy_config(self):
        return self.experiment.strategy_config

    def create_model_dir(self) -> None:
        """Creates the model_dir, once nothing else can fail before the run (or says why not)."""
        model_dir_lib.create(self.model_dir, name=self.entry.name)


def check_task_counts(num_workers: int, num_ps: int) -> None:
    """tfdist-launch's --num_workers and --num_ps (a local run and --emit alike)."""
    if num_workers < 0 or num_ps < 0:
        raise ConfigError("--num_workers and --num_ps must be >= 0.")


def prepare(
    entry: EntryPoint,
    model_dir: str | os.PathLike | None,
    gin_files: Sequence[str],
    gin_bindings: Sequence[str] = (),
    modules: Sequence[str] = (),
    *,
    cluster: cluster_lib.ClusterConfig | None = None,
    trainer_cls: type | None = None,
    before_gin: Callable[[], None] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Prepared:
    """Checks what `entry` runs, in this order, and creates nothing.

    1. model_dir, as `entry` says (shared by several processes unless `cluster` is a lone one);
    2. `entry.one_process`: the cluster from `environ` must be a lone process;
    3. `before_gin`, the entry point's own quick checks (reading the gin files imports the user's
       modules, which may start TensorFlow);
    4. the gin files, bindings and `modules` (a `trainer_cls` given in Python wins over gin's
       `train.trainer_cls`), the Trainer's bindings included;
    5. with a cluster: a strategy `entry.one_process` cannot run in one process, then the
       strategy's own check of the cluster, and the task's action.

    Raises:
      ConfigError (a ClusterConfigError for a cluster the strategy cannot run): one sentence.
    """
    model_dir = os.fspath(model_dir) if model_dir else ""
    _check_model_dir(entry, model_dir, cluster)
    if entry.one_process:
        cluster = _lone_process(entry.one_process, environ)
    if before_gin is not None:
        before_gin()
    from tfdist_trainer.plan.gin_config import load_experiment

    overrides = {} if trainer_cls is None else {"trainer_cls": trainer_cls}
    experiment = load_experiment(list(gin_files), list(gin_bindings), list(modules), **overrides)
    action = None
    if cluster is not None:
        action = _checked_action(entry, experiment, cluster)
    return Prepared(entry, model_dir, experiment, cluster, action)


def _check_model_dir(
    entry: EntryPoint, model_dir: str, cluster: cluster_lib.ClusterConfig | None
) -> None:
    """model_dir as `entry` needs it: only set for --emit (the pods' storage is not this
    machine's), else checked here, and shared by several processes unless `cluster` is a lone one."""
    if not entry.local:
        if not model_dir:
            raise entry.error(entry.missing or f"{entry.name} is required.")
        return
    several = cluster is None or not cluster.is_local
    model_dir_lib.check(
        model_dir,
        name=entry.name,
        shared_by=entry.shared_by if several else None,
        missing=entry.missing,
        error=entry.error,
    )


def _checked_action(
    entry: EntryPoint, experiment: Any, cluster: cluster_lib.ClusterConfig
) -> Action:
    """What the task does, once the strategy has accepted `cluster` (and, for `entry.one_process`,
    runs in one process) and the checkpoint settings can work on it."""
    strategy_config = experiment.strategy_config
    if entry.one_process:
        _one_process_strategy(entry.one_process, strategy_config)
    strategy_config.validate(cluster)
    if experiment.checkpoints.background and strategy_config.saves_with_peers(cluster):
        raise ConfigError(
            f"train.async_checkpoint=True cannot work under {strategy_config.name} across "
            f"workers: every worker takes part in each save (collectives), which cannot run "
            f"on one worker's background thread; leave train.async_checkpoint unset (on "
            f"where it is safe) or set it to False."
        )
    return strategy_config.action(cluster)


def _lone_process(what: str, environ: Mapping[str, str]) -> cluster_lib.ClusterConfig:
    cluster = cluster_lib.resolve(environ)
    if not cluster.is_local:
        raise ConfigError(
            f"TF_CONFIG names a cluster ({', '.join(cluster.cluster)}), but {what} "
            f"trains in this one process; unset TF_CONFIG, or run tfdist-train on each task."
        )
    return cluster


def _one_process_strategy(what: str, strategy_config) -> None:
    layout = strategy_config.launch_layout(num_workers=2, num_ps=1)
    if layout != {cluster_lib.CHIEF: 1}:
        raise ConfigError(
            f"strategy {strategy_config.name} needs one process per cluster task "
            f"({', '.join(layout)} tasks), but {what} trains in this one process; pick one_device, "
            f"mirrored or model_parallel, or start the job with tfdist-launch (or tfdist-train on "
            f"each task)."
        )
