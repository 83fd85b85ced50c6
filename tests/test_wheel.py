"""The wheel works for a user outside the repository (issue 22, item 5).

The test builds the wheel from a copy of the package's sources, installs it into a fresh
virtualenv and trains what a user writes (a Trainer module of their own and a gin file that
includes the package's strategy gin file by name, `include 'strategies/x.gin'`) from a
directory that is not the repository, with the virtualenv's own `tfdist-train` and
`tfdist-launch`, under every strategy.

The virtualenv downloads nothing: it is made by the standard library's `venv`, without pip,
and one .pth line names the site-packages of the Python that runs this suite (TensorFlow,
Keras, gin, pip). A .pth line is a plain path, so the suite's editable install of the checkout
(its own .pth file and import hook) is not seen there; `pip install --no-deps` puts the wheel
into the new virtualenv, whose site-packages come first. Each run checks that tfdist_trainer
was imported from the new virtualenv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile

import clusterlib
import pytest
from clusterlib import REPO

from tfdist_trainer.plan.strategies import NAMES

STEPS = 20
TIMEOUT_S = 240
STRATEGIES = NAMES  # the wheel ships every strategy's gin file and trains under each

USER_MODULE = textwrap.dedent('''
    """A user's trainer: a small MLP on synthetic data (label = x.w > 0)."""

    import gin
    import keras
    import tensorflow as tf

    from tfdist_trainer import Trainer, shard

    DIM = 8
    TRUE_W = [1.0, -2.0, 0.5, 3.0, -1.0, 0.0, 2.0, -0.5]


    def _examples(count):
        def make(i):
            x = tf.random.stateless_normal([DIM], seed=tf.stack([i, tf.constant(7, tf.int64)]))
            y = tf.cast(tf.tensordot(x, tf.constant(TRUE_W), 1) > 0, tf.float32)[None]
            return x, y
        return tf.data.Dataset.range(count).map(make)


    @gin.configurable
    class TinyTrainer(Trainer):
        def build_model(self):
            return keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(16, activation="relu"),
                                     keras.layers.Dense(1)])

        def build_optimizer(self):
            return keras.optimizers.Adam(0.01)

        def build_train_dataset(self, input_context):
            dataset = shard(_examples(1024), input_context)
            return (dataset.cache().repeat()
                    .batch(self.per_replica_batch_size(input_context), drop_remainder=True))

        def compute_loss(self, labels, predictions):
            return keras.losses.binary_crossentropy(labels, predictions, from_logits=True)
''')

# The strategy comes from the package by name: no path into the repository anywhere.
USER_GIN = textwrap.dedent("""
    import tiny_trainer

    train.trainer_cls = @TinyTrainer
    train.train_steps = {steps}
    train.log_every_n_steps = 10
    Trainer.global_batch_size = 32

    include 'strategies/{strategy}.gin'
""")

# Where the package's tfdist_trainer lives in the new virtualenv, as its python prints it.
WHERE = "import tfdist_trainer, os; print(os.path.realpath(tfdist_trainer.__file__))"


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    assert r.returncode == 0, (
        f"{' '.join(cmd)} exited {r.returncode}:\n{(r.stdout + r.stderr)[-6000:]}"
    )
    return r


def _user_env() -> dict[str, str]:
    """A user's environment: no repository on PYTHONPATH, no suite virtualenv."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TF_CONFIG")
    }
    env.update(PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1", TF_CPP_MIN_LOG_LEVEL="1")
    return env


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> str:
    """A fresh virtualenv with the wheel installed; returns its bin directory."""
    root = tmp_path_factory.mktemp("wheel")
    # A copy of what the wheel is built from (recipes/ too, to show it stays out), so the build
    # writes nothing into the checkout.
    src = root / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("tfdist_trainer", "recipes"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=ignore)
    for name in os.listdir(REPO):
        if name in ("pyproject.toml", "README.md") or name.startswith(("LICENSE", "LICENCE")):
            shutil.copy(os.path.join(REPO, name), src / name)
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--quiet", "-w", str(dist), str(src)],
        timeout=300,
    )
    (wheel,) = dist.glob("tfdist_trainer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("recipes/")], names
    for strategy in STRATEGIES:
        assert f"tfdist_trainer/configs/strategies/{strategy}.gin" in names, names

    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site_dir = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60
    ).stdout.strip()
    suite = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    with open(os.path.join(site_dir, "suite-packages.pth"), "w") as f:
        f.write("".join(f"{path}\n" for path in suite))
    # --ignore-installed: the suite's editable tfdist_trainer is visible to pip's metadata scan
    # through the .pth line; pip must neither uninstall it nor count it as installed here.
    _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed"]
        + ["--quiet", "--disable-pip-version-check", str(wheel)],
        env=_user_env(),
        cwd=str(root),
        timeout=300,
    )
    where = _run([python, "-c", WHERE], env=_user_env(), cwd=str(root), timeout=120).stdout
    assert where.strip().startswith(os.path.realpath(site_dir) + os.sep), where
    return str(env_dir / "bin")


@pytest.mark.cluster
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_wheel_trains_a_user_trainer_outside_the_repository(wheel_venv, tmp_path, strategy):
    project = tmp_path / "my_project"
    project.mkdir()
    (project / "tiny_trainer.py").write_text(USER_MODULE)
    (project / "experiment.gin").write_text(USER_GIN.format(steps=STEPS, strategy=strategy))
    model_dir = str(tmp_path / "model_dir")
    train_args = ["--gin_file=experiment.gin", f"--model_dir={model_dir}"]
    if strategy == "multi_worker_mirrored":
        cmd = [f"{wheel_venv}/tfdist-launch", "--num_workers=2", "--", *train_args]
    elif strategy == "parameter_server":
        cmd = [f"{wheel_venv}/tfdist-launch", "--num_workers=1", "--num_ps=1", "--", *train_args]
    else:
        cmd = [f"{wheel_venv}/tfdist-train", *train_args]
    result = clusterlib.run(cmd, env=_user_env(), cwd=str(project), timeout=TIMEOUT_S)
    out = result.stdout
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{out[-8000:]}"
    assert f"under {strategy}" in out, f"the run did not use {strategy}:\n{out[-5000:]}"
    steps = [r["step"] for r in clusterlib.train_records(model_dir)]
    assert steps and steps[-1] == STEPS, f"train steps {steps}:\n{out[-5000:]}"
    assert os.path.exists(os.path.join(model_dir, "training_done")), out[-5000:]
    assert clusterlib.no_process_left(model_dir) == []
