"""The package's layout promises, beyond what `lint-imports` checks statically in `make lint`.

The contracts in pyproject.toml ([tool.importlinter]) say which layer may import which, and
that the TF-free layers import no TensorFlow at all. Here: that importing them really
starts no TensorFlow (an import gin or absl does on their behalf would not show in the
static graph), that no two modules import each other (directly or around a loop), and
that each strategy's topology (TF-free) has its runtime (TF).
"""

from __future__ import annotations

import pkgutil
import subprocess

import grimp
from clusterlib import PYTHON, REPO, base_env

import tfdist_trainer

#: The packages that run before (or without) TensorFlow: gin settings, the cluster, the
#: launcher, hooks, model_dir files; the same list as the tf-free contract in pyproject.toml.
TF_FREE_PACKAGES = ["plan", "launch", "hooks", "io"]
TF_FREE_MODULES = ["tfdist_trainer", "tfdist_trainer.errors", "tfdist_trainer.checks"]


def _tf_free_modules() -> list[str]:
    names = list(TF_FREE_MODULES)
    for package in TF_FREE_PACKAGES:
        path = [f"{tfdist_trainer.__path__[0]}/{package}"]
        names.append(f"tfdist_trainer.{package}")
        names += [
            f"tfdist_trainer.{package}.{m.name}"
            for m in pkgutil.iter_modules(path)
            if m.name != "__main__"
        ]
    return names


def test_planning_modules_import_no_tensorflow():
    modules = _tf_free_modules()
    assert "tfdist_trainer.launch.main" in modules and "tfdist_trainer.plan.cluster" in modules
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        f"heavy = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\nprint(heavy)"
    )
    result = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"imported at planning time: {result.stdout.strip()}"


def _import_cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles():
    """Function-level imports count: a cycle hidden inside a function is still a cycle."""
    graph = grimp.build_graph("tfdist_trainer", exclude_type_checking_imports=True)
    assert _import_cycles(graph) == []


def test_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: a package whose two modules import each other is reported."""
    package = tmp_path / "cyclic_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from cyclic_pkg import b\n")
    (package / "b.py").write_text("from cyclic_pkg import a\n")
    (package / "c.py").write_text("from cyclic_pkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_pkg", cache_dir=None)
    assert _import_cycles(graph) == [["cyclic_pkg.a", "cyclic_pkg.b"]]


def test_strategies_hold_topology_only_and_the_runtime_builds_each_one():
    """plan.strategies (TF-free) says what a strategy is; runtime.strategies alone builds it."""
    from tfdist_trainer.plan import strategies
    from tfdist_trainer.runtime import strategies as runtime_strategies

    configs = [strategies.config_class(name)() for name in strategies.NAMES]
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
        assert issubclass(
            runtime_strategies.runtime_class(config.name), runtime_strategies.StrategyRuntime
        ), config.name
