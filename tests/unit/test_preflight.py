"""The one preflight of every entry point (tfdist_trainer.plan.preflight), in process.

Each entry point's bad input is one sentence raised as a ConfigError (exit 2 at the command line),
checked in a fixed order (model_dir, the entry point's own quick checks, gin, the strategy against
the cluster), and nothing is created before `Prepared.create_model_dir`. Through the real commands:
tests/test_bad_inputs.py; the Python API: test_python_api_checks.py.
"""

from __future__ import annotations

import json

import gin
import pytest

from tfdist_trainer import Trainer
from tfdist_trainer.errors import EXIT_CONFIG, ClusterConfigError, ConfigError
from tfdist_trainer.plan import cluster as cluster_lib
from tfdist_trainer.plan import preflight
from tfdist_trainer.plan.strategies import Action


@gin.configurable("PreflightTrainer")
class PreflightTrainer(Trainer):
    """A Trainer that is never built: the preflight only reads its class."""


class OtherTrainer(PreflightTrainer):
    """The trainer_cls a Python caller gives."""


def bindings(strategy: str = "one_device", *more: str) -> list[str]:
    return ["train.trainer_cls = @PreflightTrainer", f"train.strategy = @{strategy}", *more]


def tf_config(**cluster) -> str:
    task_type = next(iter(cluster))
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": 0}})


PS_CLUSTER = {"chief": ["h0:1"], "worker": ["h1:1"], "ps": ["h2:1"]}


def refused(error_type: type[ConfigError], *args, **kwargs) -> str:
    """The one sentence `prepare(*args, **kwargs)` raises; asserts its type and exit code."""
    with pytest.raises(ConfigError) as raised:
        preflight.prepare(*args, **kwargs)
    assert type(raised.value) is error_type, type(raised.value)
    assert raised.value.exit_code == EXIT_CONFIG
    message = str(raised.value)
    assert "\n" not in message and message.endswith("."), message
    return message


@pytest.mark.parametrize(
    "entry, message",
    [
        (preflight.TRAIN_TASK, "--model_dir is required; every task of a job needs the same one."),
        (
            preflight.CHECKPOINT_TASK,
            "--model_dir is required; every task of a job needs the same one.",
        ),
        (
            preflight.LAUNCH,
            "--model_dir is required after '--' (the tasks share it); e.g. -- "
            "--model_dir=/tmp/run1.",
        ),
        (
            preflight.EMIT,
            "--model_dir is required after '--' (every pod needs the same shared one, e.g. "
            "gs://bucket/run1 or a path on --k8s_volume).",
        ),
        (
            preflight.TRAIN_API,
            "tfdist_trainer.train needs model_dir=..., a directory for this run.",
        ),
        (
            preflight.EVALUATE_API,
            "tfdist_trainer.evaluate needs model_dir=..., the run whose checkpoint to read.",
        ),
        (
            preflight.EXPORT_API,
            "tfdist_trainer.export needs model_dir=..., the run whose checkpoint to read.",
        ),
    ],
)
@pytest.mark.parametrize("model_dir", [None, ""])
def test_each_entry_point_says_its_own_sentence_for_a_missing_model_dir(entry, message, model_dir):
    assert refused(entry.error, entry, model_dir, [], bindings()) == message


def test_an_in_memory_model_dir_is_refused_where_processes_share_it():
    cluster = cluster_lib.from_tf_config(tf_config(**PS_CLUSTER))
    assert refused(
        ClusterConfigError, preflight.TRAIN_TASK, "ram://run", [], bindings(), cluster=cluster
    ) == (
        "--model_dir ram://run is in-memory and private to one process, but the tasks of a "
        "cluster must share it; use a path every task sees, or gs://, s3:// or file://."
    )
    assert refused(ConfigError, preflight.LAUNCH, "ram://run", [], bindings()) == (
        "--model_dir ram://run is in-memory and private to one process, but tfdist-launch runs "
        "each task in its own; use a path, file://, gs:// or s3://."
    )
    lone = cluster_lib.ClusterConfig(cluster={})
    prepared = preflight.prepare(preflight.TRAIN_TASK, "ram://run", [], bindings(), cluster=lone)
    assert prepared.action is Action.TRAIN


def test_a_file_is_not_a_model_dir(tmp_path):
    (tmp_path / "a_file").write_text("")
    path = str(tmp_path / "a_file")
    assert refused(ConfigError, preflight.TRAIN_API, path, [], bindings()) == (
        f"model_dir {path} is a file, not a directory; pick another path."
    )
    assert refused(ConfigError, preflight.CHECKPOINT_TASK, path, [], bindings()) == (
        f"--model_dir {path} is a file, not a directory; pick another path."
    )


def test_emit_only_requires_a_model_dir_it_cannot_see(tmp_path):
    prepared = preflight.prepare(preflight.EMIT, "gs://bucket/run1", [], bindings())
    assert prepared.model_dir == "gs://bucket/run1"
    assert (prepared.cluster, prepared.action) == (None, None)
    assert prepared.strategy_config.name == "one_device"


def test_the_checks_run_in_order_and_create_nothing(tmp_path):
    model_dir = tmp_path / "run"
    calls = []

    def before_gin():
        calls.append("before_gin")
        raise ConfigError("--image is required.")

    # model_dir first: the entry point's own checks do not run
    refused(ConfigError, preflight.LAUNCH, "", [], bindings(), before_gin=before_gin)
    assert calls == []
    # then the entry point's own checks, before the gin files are read
    message = refused(
        ConfigError, preflight.LAUNCH, model_dir, ["nowhere.gin"], [], before_gin=before_gin
    )
    assert (message, calls) == ("--image is required.", ["before_gin"])
    # then gin
    message = refused(ConfigError, preflight.LAUNCH, model_dir, ["nowhere.gin"], [])
    assert message.startswith("gin file nowhere.gin does not exist"), message
    assert not model_dir.exists()
    prepared = preflight.prepare(preflight.LAUNCH, model_dir, [], bindings())
    assert not model_dir.exists()
    prepared.create_model_dir()
    assert model_dir.is_dir()


def test_the_strategy_checks_the_tasks_cluster_and_says_what_it_does(tmp_path):
    cluster = cluster_lib.from_tf_config(tf_config(chief=["h0:1"], worker=["h1:1"]))
    message = refused(
        ClusterConfigError,
        preflight.TRAIN_TASK,
        tmp_path,
        [],
        bindings("parameter_server"),
        cluster=cluster,
    )
    assert "parameter_server needs at least one ps task" in message
    worker = cluster_lib.from_tf_config(
        json.dumps({"cluster": PS_CLUSTER, "task": {"type": "worker", "index": 0}})
    )
    prepared = preflight.prepare(
        preflight.TRAIN_TASK, tmp_path, [], bindings("parameter_server"), cluster=worker
    )
    assert (prepared.cluster, prepared.action) == (worker, Action.SERVE)


def test_async_checkpoint_is_refused_only_where_every_worker_takes_part_in_a_save(tmp_path):
    workers = {"worker": ["h0:1", "h1:1"]}
    mwms = cluster_lib.from_tf_config(tf_config(**workers))
    asked = bindings("multi_worker_mirrored", "train.async_checkpoint = True")
    message = refused(ConfigError, preflight.TRAIN_TASK, tmp_path, [], asked, cluster=mwms)
    assert message.startswith(
        "train.async_checkpoint=True cannot work under multi_worker_mirrored across workers"
    ), message
    model_parallel = bindings(
        "model_parallel",
        "model_parallel.data_parallel = 'multi_worker_mirrored'",
        "train.async_checkpoint = True",
    )
    assert "model_parallel across workers" in refused(
        ConfigError, preflight.TRAIN_TASK, tmp_path, [], model_parallel, cluster=mwms
    )
    # One worker alone, or parameter_server's chief (the ps write their own parts): accepted.
    alone = cluster_lib.from_tf_config(tf_config(worker=["h0:1"]))
    preflight.prepare(preflight.TRAIN_TASK, tmp_path, [], asked, cluster=alone)
    chief = cluster_lib.from_tf_config(tf_config(**PS_CLUSTER))
    ps_asked = bindings("parameter_server", "train.async_checkpoint = True")
    preflight.prepare(preflight.TRAIN_TASK, tmp_path, [], ps_asked, cluster=chief)


def test_the_python_api_trains_in_one_process_only(tmp_path):
    model_dir = tmp_path / "run"
    environ = {"TF_CONFIG": tf_config(**PS_CLUSTER)}
    assert refused(
        ConfigError, preflight.TRAIN_API, model_dir, [], bindings(), environ=environ
    ) == (
        "TF_CONFIG names a cluster (chief, worker, ps), but tfdist_trainer.train trains in this "
        "one process; unset TF_CONFIG, or run tfdist-train on each task."
    )
    assert refused(
        ConfigError, preflight.TRAIN_API, model_dir, [], bindings("parameter_server"), environ={}
    ) == (
        "strategy parameter_server needs one process per cluster task (chief, worker, ps tasks), "
        "but tfdist_trainer.train trains in this one process; pick one_device, mirrored or "
        "model_parallel, or start the job with tfdist-launch (or tfdist-train on each task)."
    )
    prepared = preflight.prepare(preflight.TRAIN_API, model_dir, [], bindings(), environ={})
    assert prepared.cluster.is_local and prepared.action is Action.TRAIN
    assert not model_dir.exists()


def test_a_trainer_given_in_python_wins_over_gin(tmp_path):
    @gin.configurable("PreflightOtherTrainer")
    class Other(Trainer):
        pass

    prepared = preflight.prepare(
        preflight.EVALUATE_API, tmp_path, [], bindings(), trainer_cls=Other
    )
    assert prepared.experiment.trainer_cls is Other


@pytest.mark.parametrize("counts", [(-1, 0), (0, -1)])
def test_negative_task_counts_are_one_sentence(counts):
    with pytest.raises(ConfigError, match=r"^--num_workers and --num_ps must be >= 0\.$"):
        preflight.check_task_counts(*counts)
    preflight.check_task_counts(0, 0)
