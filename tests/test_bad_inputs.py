"""Every bad input a user can give, run through the real `tfdist-train` and `tfdist-launch`.

Each case must end in ONE sentence (``[role] error: ...``) that names the
problem, a non-zero exit code (2 for configuration errors), no traceback, no
process left behind, and an untouched model_dir. Cases that fail before
TensorFlow is imported take about a second; the others about five.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid

import pytest
from clusterlib import (
    FAST_MNIST,
    HandCluster,
    base_env,
    free_port_cluster,
    launch_cmd,
    no_process_left,
    run,
    strategy_gin,
    tf_config,
    train_cmd,
    user_env,
)

EXIT_CONFIG = 2
_ERROR_LINE = re.compile(r"^\[([^\]]+)\] error: (.*)$")


@pytest.fixture
def model_dir(tmp_path) -> str:
    """A unique model_dir: it is also the marker that finds processes left behind."""
    return str(tmp_path / f"model-{uuid.uuid4().hex[:8]}")


def _check(
    output: str,
    returncode: int,
    marker: str,
    words: list[str],
    *,
    role: str | None = None,
    code: int = EXIT_CONFIG,
    model_dir: str | None = None,
) -> str:
    """Asserts one error sentence containing `words`, exit `code`, no traceback and nothing left behind."""
    errors = [m for m in map(_ERROR_LINE.match, output.splitlines()) if m]
    assert returncode == code, f"exit code {returncode}, expected {code}; output:\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    assert len(errors) == 1, f"expected exactly one 'error:' line; output:\n{output[-4000:]}"
    got_role, message = errors[0].groups()
    if role is not None:
        assert got_role == role, errors[0].group(0)
    assert message.endswith("."), message
    for word in words:
        assert word.lower() in message.lower(), f"{word!r} not in: {message}"
    assert no_process_left(marker) == []
    if model_dir is not None:  # a configuration error must not create or touch the model_dir
        assert not os.path.exists(model_dir) or os.listdir(model_dir) == [], os.listdir(model_dir)
    return message


def _check_run(
    r: subprocess.CompletedProcess, model_dir: str, words: list[str], *, role: str | None = None
) -> str:
    """_check for a finished command whose model_dir is also the marker of its processes."""
    return _check(r.stdout, r.returncode, model_dir, words, role=role, model_dir=model_dir)


def _train(
    *args: str, tf_config_text: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    extra = {"TF_CONFIG": tf_config_text} if tf_config_text is not None else {}
    return run(train_cmd(*args), env=base_env(extra), timeout=timeout)


def _launch(
    launch_args: list[str], train_args: list[str], timeout: float = 120
) -> subprocess.CompletedProcess:
    return run(launch_cmd(launch_args, train_args), env=base_env(), timeout=timeout)


def _mnist(strategy: str, model_dir: str, *extra: str) -> list[str]:
    return [*FAST_MNIST, strategy_gin(strategy), f"--model_dir={model_dir}", *extra]


# -- the cluster description (fails before TensorFlow is imported) -------------------


def test_tf_config_not_json(model_dir):
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir), tf_config_text='{"cluster": {"worker": ["h:1"]'
    )
    _check_run(r, model_dir, ["TF_CONFIG", "not valid JSON"])


def test_task_type_missing_from_cluster(model_dir):
    cluster = free_port_cluster({"worker": 2})
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir), tf_config_text=tf_config(cluster, "ps", 0)
    )
    _check_run(r, model_dir, ["TF_CONFIG", "'ps' is not in the cluster", "which has worker"])


def test_tf_config_with_both_master_and_chief(model_dir):
    """'master' is the Estimator-era name of 'chief': both at once would silently lose one address."""
    cluster = free_port_cluster({"worker": 1})
    text = json.dumps(
        {
            "cluster": {"master": ["127.0.0.1:1"], "chief": ["127.0.0.1:2"], **cluster},
            "task": {"type": "master", "index": 0},
        }
    )
    r = _train(*_mnist("multi_worker_mirrored", model_dir), tf_config_text=text)
    _check_run(
        r,
        model_dir,
        ["TF_CONFIG", "names the chief twice", "'master'", "'chief'", "keep one of them"],
    )


def test_task_index_out_of_range(model_dir):
    cluster = free_port_cluster({"worker": 2})
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir), tf_config_text=tf_config(cluster, "worker", 2)
    )
    _check_run(r, model_dir, ["task index 2", "out of range", "'worker'", "valid: 0..1"])


def test_job_name_with_task_index_out_of_range(model_dir):
    cluster = free_port_cluster({"worker": 2, "ps": 1})
    r = _train(
        *_mnist("parameter_server", model_dir),
        "--job_name=ps",
        "--task_index=1",
        f"--worker_hosts={','.join(cluster['worker'])}",
        f"--ps_hosts={cluster['ps'][0]}",
    )
    _check_run(r, model_dir, ["cluster flags", "task index 1", "out of range", "'ps'"])


def test_hosts_without_job_name(model_dir):
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir), "--worker_hosts=127.0.0.1:2222,127.0.0.1:2223"
    )
    _check_run(r, model_dir, ["--job_name is not", "add --job_name"])


def test_missing_model_dir():
    marker = f"train.seed={uuid.uuid4().int % 10**9}"
    r = _train(*FAST_MNIST, strategy_gin("one_device"), f"--gin_bindings={marker}")
    _check(r.stdout, r.returncode, marker, ["--model_dir is required"])


def test_model_dir_is_a_file(tmp_path):
    path = tmp_path / f"not-a-dir-{uuid.uuid4().hex[:8]}"
    path.write_text("precious")
    r = _train(*_mnist("one_device", str(path)))
    _check(r.stdout, r.returncode, str(path), ["--model_dir", str(path), "not a directory"])
    assert path.read_text() == "precious"


@pytest.mark.parametrize(
    "command, words",
    [
        ("train", ["Unknown command line flag 'modle_dir'", "model_dir"]),
        ("launch", ["Unknown command line flag 'num_worker'", "num_workers"]),
        ("bad_value", ["--task_index=two", "invalid literal"]),
    ],
)
def test_bad_flag(model_dir, command, words):
    if command == "train":
        r = _train(*FAST_MNIST, f"--modle_dir={model_dir}")
    elif command == "launch":
        r = _launch(["--num_worker=2"], _mnist("parameter_server", model_dir))
    else:
        r = _train(*_mnist("one_device", model_dir), "--task_index=two")
    _check_run(r, model_dir, words)


def test_launch_negative_num_workers(model_dir):
    r = _launch(["--num_workers=-1"], _mnist("parameter_server", model_dir))
    _check_run(r, model_dir, ["--num_workers", ">= 0"], role="launch")


@pytest.mark.parametrize(
    "value, words",
    [
        ("0", ["--backoff_window_s", "positive number of seconds", "got 0.0"]),
        ("soon", ["backoff_window_s", "soon"]),
    ],
)
def test_launch_backoff_window_not_a_positive_number(model_dir, value, words):
    r = _launch([f"--backoff_window_s={value}"], _mnist("parameter_server", model_dir))
    _check(r.stdout, r.returncode, model_dir, words, role="launch", model_dir=model_dir)


def test_missing_gin_file(model_dir):
    missing = os.path.join(os.path.dirname(model_dir), "no-such.gin")
    r = _train(*_mnist("one_device", model_dir), f"--gin_file={missing}")
    _check_run(r, model_dir, [f"gin file {missing} does not exist", "--gin_file"])


# -- the gin configuration and modules (fail after TensorFlow is imported) --------------


@pytest.mark.parametrize(
    "binding, words",
    [
        (
            "train.trian_steps=5",
            ["bad gin configuration", "'train'", "'trian_steps'", "train.trian_steps=5"],
        ),
        (
            "NoSuchTrainer.learning_rate=0.1",
            ["bad gin configuration", "No configurable matching 'NoSuchTrainer'"],
        ),
    ],
)
def test_unknown_gin_binding(model_dir, binding, words):
    r = _train(*_mnist("one_device", model_dir), f"--gin_bindings={binding}")
    _check_run(r, model_dir, words)


@pytest.mark.parametrize(
    "binding, words",
    [
        (
            "parameter_server.stall_timeout_s=-5",
            [
                "parameter_server.stall_timeout_s must be a number of seconds >= 0",
                "0: no watchdog",
                "-5",
            ],
        ),
        (
            "parameter_server.steps_per_loop=0",
            ["parameter_server.steps_per_loop must be an integer >= 1", "got 0"],
        ),
    ],
)
def test_bad_parameter_server_setting(model_dir, binding, words):
    r = _launch([], [*_mnist("parameter_server", model_dir), f"--gin_bindings={binding}"])
    _check_run(r, model_dir, words, role="launch")


def test_gin_file_with_a_syntax_error(model_dir, tmp_path):
    broken = tmp_path / "broken.gin"
    broken.write_text("train.train_steps = (10,\n")
    r = _train(*_mnist("one_device", model_dir), f"--gin_file={broken}")
    _check_run(r, model_dir, ["bad gin configuration", "unclosed bracket"])


def test_trainer_cls_unset(model_dir):
    r = _train(strategy_gin("one_device"), f"--model_dir={model_dir}")
    _check_run(r, model_dir, ["train.trainer_cls is not set", "@MyTrainer"])


def test_bad_module(model_dir):
    r = _train(*_mnist("one_device", model_dir), "--module=no_such_user_module")
    _check_run(r, model_dir, ["--module no_such_user_module", "could not be imported"])


# A user's Trainer as the recipes' used to be written (and users copy): **kwargs forwarded to a
# base of their own, then to Trainer. Gin accepts any parameter name for it.
USER_CLICK_MODULE = """
import gin
from tfdist_trainer import Trainer


class UserBaseTrainer(Trainer):
    def __init__(self, *, learning_rate=0.01, **kwargs):
        super().__init__(**kwargs)
        self.learning_rate = learning_rate


@gin.configurable
class UserClickTrainer(UserBaseTrainer):
    def __init__(self, *, embedding_dim=4, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = embedding_dim
"""


@pytest.mark.parametrize("command", ["train", "launch"])
def test_typo_in_a_user_trainer_binding(model_dir, tmp_path, command):
    """One sentence and exit 2 before any task starts (it used to start the cluster, then the
    chief failed with a 40-line TypeError); `tfdist-launch` starts no task: no task line at all."""
    (tmp_path / "user_click.py").write_text(USER_CLICK_MODULE)
    args = [
        strategy_gin("one_device" if command == "train" else "parameter_server"),
        "--module=user_click",
        "--gin_bindings=train.trainer_cls=@UserClickTrainer",
        "--gin_bindings=UserClickTrainer.embeding_dim=8",
        f"--model_dir={model_dir}",
    ]
    cmd = (
        train_cmd(*args)
        if command == "train"
        else launch_cmd(["--num_workers=2", "--num_ps=1"], args)
    )
    started = time.monotonic()
    r = run(cmd, env=user_env(tmp_path), timeout=120)
    elapsed = time.monotonic() - started
    message = _check_run(
        r,
        model_dir,
        [
            "gin binding UserClickTrainer.embeding_dim names no parameter of UserClickTrainer",
            "did you mean UserClickTrainer.embedding_dim?",
            "UserBaseTrainer's learning_rate and Trainer's global_batch_size, eval_batch_size",
        ],
        role="local" if command == "train" else "launch",
    )
    assert not re.search(r"^\[(chief|worker|ps|evaluator):|started ", r.stdout, re.M), r.stdout
    # TensorFlow's import (the user module needs Trainer) is most of it; a cluster that starts
    # and fails took 35 s. Generous: this machine may be running another suite.
    assert elapsed < 60, f"{elapsed:.0f}s: {message}"


# -- strategy versus cluster -----------------------------------------------------------


def test_parameter_server_without_ps_by_hand(model_dir):
    cluster = free_port_cluster({"chief": 1, "worker": 2})
    r = _train(
        *_mnist("parameter_server", model_dir), tf_config_text=tf_config(cluster, "chief", 0)
    )
    _check_run(
        r,
        model_dir,
        ["parameter_server needs at least one ps task", "add ps tasks"],
        role="chief:0",
    )


def test_parameter_server_without_ps_via_launcher(model_dir):
    r = _launch(["--num_ps=0"], _mnist("parameter_server", model_dir))
    _check_run(
        r, model_dir, ["parameter_server needs at least one ps task", "--num_ps"], role="launch"
    )


def test_multi_worker_mirrored_with_a_ps_job(model_dir):
    cluster = free_port_cluster({"worker": 2, "ps": 1})
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir), tf_config_text=tf_config(cluster, "worker", 0)
    )
    _check_run(
        r, model_dir, ["multi_worker_mirrored", "ps job", "remove the ps tasks"], role="worker:0"
    )


def test_async_checkpoint_where_every_worker_takes_part_in_a_save(model_dir):
    cluster = free_port_cluster({"worker": 2})
    r = _train(
        *_mnist("multi_worker_mirrored", model_dir, "--gin_bindings=train.async_checkpoint=True"),
        tf_config_text=tf_config(cluster, "worker", 0),
    )
    _check_run(
        r,
        model_dir,
        ["train.async_checkpoint=True", "multi_worker_mirrored", "every worker", "set it to False"],
        role="worker:0",
    )


# -- the network --------------------------------------------------------------------------


def test_port_already_in_use(model_dir):
    cluster = free_port_cluster({"chief": 1, "worker": 1, "ps": 1})
    port = int(cluster["ps"][0].rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen(1)
        r = _train(
            *_mnist("parameter_server", model_dir), tf_config_text=tf_config(cluster, "ps", 0)
        )
    _check_run(r, model_dir, [f"port {port}", "ps:0", "already in use"], role="ps:0")


def _started_alone(
    cluster: dict[str, list[str]], task_type: str, strategy: str, model_dir: str, log_dir: str
) -> tuple[int, str]:
    """Starts only `task_type`:0 of `cluster` (its peers never start; --startup_timeout_s=3) and
    waits for it to give up; returns its exit code and its log."""
    hand = HandCluster(cluster, _mnist(strategy, model_dir, "--startup_timeout_s=3"), log_dir)
    try:
        hand.start(task_type, 0)
        code = hand.wait(f"{task_type}:0", timeout=120)
    finally:
        hand.kill_all()
    return code, hand.log(f"{task_type}:0")


@pytest.mark.cluster
def test_parameter_server_chief_whose_peers_never_start(model_dir, tmp_path):
    cluster = free_port_cluster({"chief": 1, "worker": 2, "ps": 1})
    code, log = _started_alone(cluster, "chief", "parameter_server", model_dir, str(tmp_path))
    missing = [
        f"worker:0 at {cluster['worker'][0]}",
        f"worker:1 at {cluster['worker'][1]}",
        f"ps:0 at {cluster['ps'][0]}",
    ]
    message = _check(
        log,
        code,
        model_dir,
        [*missing, "never answered within 3s", "start those tasks"],
        role="chief:0",
        model_dir=model_dir,
    )
    assert "chief:0 at" not in message


@pytest.mark.cluster
def test_multi_worker_mirrored_worker_whose_peer_never_starts(model_dir, tmp_path):
    cluster = free_port_cluster({"worker": 2})
    code, log = _started_alone(cluster, "worker", "multi_worker_mirrored", model_dir, str(tmp_path))
    _check(
        log,
        code,
        model_dir,
        [f"worker:1 at {cluster['worker'][1]}", "never answered within 3s", "start that task"],
        role="worker:0",
        model_dir=model_dir,
    )
    # worker:0 held its own port while it waited; it must be free again.
    from tfdist_trainer.plan.network import port_is_free

    assert port_is_free(int(cluster["worker"][0].rsplit(":", 1)[1]))


# -- a bug in the user's own code ------------------------------------------------------------

BUGGY_MODULE = """
import gin
from recipes.mnist.trainer import MnistTrainer


@gin.configurable
class BuggyTrainer(MnistTrainer):
    def build_model(self):
        raise ValueError("boom in the user's build_model")
"""


def test_a_bug_in_user_code_keeps_its_traceback(model_dir, tmp_path):
    """Not one of the package's own errors: the user needs the traceback into their code, not one line."""
    (tmp_path / "buggy_trainer.py").write_text(BUGGY_MODULE)
    env = base_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), base_env()["PYTHONPATH"]])})
    r = run(
        train_cmd(
            *_mnist("one_device", model_dir),
            "--module=buggy_trainer",
            "--gin_bindings=train.trainer_cls=@BuggyTrainer",
        ),
        env=env,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout[-4000:]
    assert "Traceback (most recent call last)" in r.stdout, r.stdout[-4000:]
    assert 'buggy_trainer.py", line 9, in build_model' in r.stdout, r.stdout[-4000:]
    assert "ValueError: boom in the user's build_model" in r.stdout, r.stdout[-4000:]
