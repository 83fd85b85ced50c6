"""The package's layout promises: what runs before TensorFlow starts imports no TensorFlow."""

from __future__ import annotations

import subprocess

from clusterlib import PYTHON, REPO, base_env

#: Everything the CLI and the launcher use to load the configuration, validate the cluster, plan the
#: tasks and write Kubernetes manifests, before (or without) starting TensorFlow.
TF_FREE_MODULES = [
    "tfdist_trainer",
    "tfdist_trainer.experiment",
    "tfdist_trainer.strategies",
    "tfdist_trainer.config",
    "tfdist_trainer.cluster",
    "tfdist_trainer.launch",
    "tfdist_trainer.k8s",
    "tfdist_trainer.errors",
    "tfdist_trainer.storage",
    "tfdist_trainer.markers",
    "tfdist_trainer.hooks",
    "tfdist_trainer.netns",
    "tfdist_trainer.placement",
    "tfdist_trainer.task",
]


def test_planning_modules_import_no_tensorflow():
    code = (
        f"import importlib, sys\nfor name in {TF_FREE_MODULES!r}:\n    importlib.import_module(name)\n"
        f"heavy = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\nprint(heavy)"
    )
    result = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"imported at planning time: {result.stdout.strip()}"


def test_strategies_hold_topology_only_and_the_runtime_builds_each_one():
    """strategies.py (TF-free) says what a strategy is; strategy_runtime.py alone builds it."""
    from tfdist_trainer import strategies, strategy_runtime

    configs = [
        strategies.OneDevice(),
        strategies.Mirrored(),
        strategies.MultiWorkerMirrored(),
        strategies.ParameterServer(),
        strategies.ModelParallel(),
    ]
    runtime_members = (
        "create",
        "prepare_devices",
        "prepare_model",
        "train_step_fn",
        "create_coordinator",
        "communication_options",
    )
    for config in configs:
        assert [m for m in runtime_members if hasattr(config, m)] == [], type(config).__name__
        assert any(cls in strategy_runtime._STARTERS for cls in type(config).__mro__), config.name
