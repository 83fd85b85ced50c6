"""`make test` from a fresh clone under a directory only its owner can enter (issue 25).

Many CI systems and users' scratch space hand out such directories
(`mktemp -d` makes them 0700), and `make test` there creates its virtualenv
inside the clone. A test that runs something as another user (user nobody,
tests/test_private_network.py) must then read neither the checkout nor the
virtualenv.

The check clones this repository's HEAD (what a new user gets: uncommitted
changes are not in it) into `tempfile.mkdtemp()` and runs those tests from
the clone, with the clone's own virtualenv as `make test` would have it.
That virtualenv is made by the standard library's `venv`, without pip, in a
fraction of a second, and installs nothing: its one .pth line names the
site-packages of the Python that runs this suite, a plain path, so that the
editable install of the original checkout is not seen. Run with this suite's
Python instead, user nobody would find the package through that editable
install wherever the original checkout is readable, and the check would pass
with the bug in place.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
import venv

import pytest
from clusterlib import REPO

# The tests whose outcome depends on where the checkout lives.
TESTS = ["tests/test_private_network.py::test_private_network_names_why_it_cannot_run"]


def _clone_into(parent: str) -> str:
    git = shutil.which("git")
    if git is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("needs git and a git checkout of the repository")
    clone = os.path.join(parent, "clone")
    r = subprocess.run(
        [git, "clone", "-q", REPO, clone],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return clone


def _virtualenv_inside(clone: str) -> str:
    """`clone/.venv` without pip, its packages those of the running Python; returns its python."""
    env_dir = os.path.join(clone, ".venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = os.path.join(env_dir, "bin", "python")
    site_dir = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    with open(os.path.join(site_dir, "suite-packages.pth"), "w") as f:
        f.write("".join(f"{path}\n" for path in ours))
    return python


def test_private_checkout_passes_the_tests_that_depend_on_where_it_lives():
    parent = tempfile.mkdtemp(prefix="tfdist-fresh-clone-")
    try:
        assert stat.S_IMODE(os.stat(parent).st_mode) == 0o700
        clone = _clone_into(parent)
        python = _virtualenv_inside(clone)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = clone
        r = subprocess.run(
            [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *TESTS],
            capture_output=True,
            text=True,
            cwd=clone,
            env=env,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert f"{len(TESTS)} passed" in out and "skipped" not in out, out[-3000:]
