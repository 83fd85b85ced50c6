"""BUILD.md's Dockerfile builds the image its `tfdist-launch --emit=k8s` command expects (issue 40).

No docker runs: the Dockerfile in BUILD.md's Kubernetes section is parsed (instructions,
continuations, comments), its COPY instructions are followed as Docker follows them (a
directory source copies its contents; a destination ending in '/' keeps the file's name; a
relative destination is under the WORKDIR of that point), and the emit command below it is built
in process into manifests. Then: the base image's Python is one the package supports; the
package goes in from the wheel BUILD.md says to build; the WORKDIR is the containers'
workingDir (--k8s_workdir's default); every relative --gin_file and --module of the command is
copied under it (the package's own strategies/*.gin aside); the ENTRYPOINT is the containers'
command, a console script of the package; the `docker build -t` tag is the command's --image.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import posixpath
import re
import shlex

import pytest
import tomllib
from clusterlib import REPO
from k8s_docs import code_blocks, kubernetes_section
from test_k8s_manifests import STRATEGIES, container, pod_templates

from tfdist_trainer.launch import k8s
from tfdist_trainer.plan.gin_config import PACKAGE_CONFIGS_DIR


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order; comments dropped, '\\' continuations joined."""
    steps = []
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def copies(steps: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """Each COPY as (its sources, its absolute destination), following the WORKDIRs before it."""
    workdir, result = "/", []
    for word, args in steps:
        if word == "WORKDIR":
            workdir = posixpath.join(workdir, args)
        elif word == "COPY":
            *sources, dest = shlex.split(args)
            result.append((sources, posixpath.join(workdir, dest)))  # keeps a trailing '/'
    return result


def image_path(copied: list[tuple[list[str], str]], path: str) -> str | None:
    """Where the project's file `path` is in the image after `copied` (the last COPY wins)."""
    found = None
    for sources, dest in copied:
        for source in sources:
            if source.endswith("/") or source == ".":  # a directory: its contents go into dest
                prefix = source.rstrip("./") and source.rstrip("/") + "/"
                if path.startswith(prefix):
                    found = posixpath.join(dest, path[len(prefix) :])
            elif source == path:
                many = dest.endswith("/") or len(sources) > 1
                found = posixpath.join(dest, posixpath.basename(path)) if many else dest
    return posixpath.normpath(found) if found else None


def emit_command(section: str) -> tuple[argparse.Namespace, argparse.Namespace]:
    """The launcher's flags and the tasks' arguments of the sh block that follows the Dockerfile."""
    after = section[section.index("```dockerfile") :]
    (command,) = [b for b in code_blocks(after, "sh") if "tfdist-launch --emit=k8s" in b][:1]
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    words = words[: words.index(">")] if ">" in words else words
    split = words.index("--")
    launch = argparse.ArgumentParser(add_help=False)
    for flag in ("--image", "--k8s_flavor", "--num_workers", "--num_ps", "--k8s_workdir"):
        launch.add_argument(flag)
    launch.add_argument("--emit")
    train = argparse.ArgumentParser(add_help=False)
    train.add_argument("--gin_file", action="append", default=[])
    train.add_argument("--module", action="append", default=[])
    train.add_argument("--model_dir")
    launch_args, unknown = launch.parse_known_args(words[1:split])
    assert unknown == [], f"a launcher flag this test does not know: {unknown}"
    train_args, unknown = train.parse_known_args(words[split + 1 :])
    assert unknown == [], f"a tfdist-train argument this test does not know: {unknown}"
    return launch_args, train_args


@pytest.fixture(scope="module")
def doc():
    section = kubernetes_section()
    (dockerfile,) = code_blocks(section, "dockerfile")
    launch_args, train_args = emit_command(section)
    strategy = [
        name
        for name in STRATEGIES
        if any(os.path.basename(g) == f"{name}.gin" for g in train_args.gin_file)
    ]
    assert len(strategy) == 1, train_args.gin_file
    objects = k8s.manifests(
        k8s.JobSpec(
            strategy_config=STRATEGIES[strategy[0]],
            name="run1",
            image=launch_args.image,
            train_args=[f"--gin_file={g}" for g in train_args.gin_file],
            flavor=launch_args.k8s_flavor or "tfjob",
            num_workers=int(launch_args.num_workers or 2),
            num_ps=int(launch_args.num_ps or 1),
        )
    )
    assert launch_args.k8s_workdir is None, "the example shows --k8s_workdir's default"
    containers = [container(t) for t in pod_templates(objects).values()]
    return argparse.Namespace(
        section=section,
        steps=instructions(dockerfile),
        launch=launch_args,
        train=train_args,
        containers=containers,
    )


def _pyproject() -> dict:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_the_base_image_has_a_python_the_package_supports(doc):
    word, base = doc.steps[0]
    assert word == "FROM", "a Dockerfile starts with FROM"
    match = re.fullmatch(r"python:3\.(\d+)(-[a-z0-9.-]+)?", base)
    assert match, f"an official python image, got {base!r}"
    minimum = re.fullmatch(r">=3\.(\d+)", _pyproject()["project"]["requires-python"])
    assert int(match.group(1)) >= int(minimum.group(1))


def test_the_package_is_installed_from_the_wheel_build_md_builds(doc):
    name = _pyproject()["project"]["name"]
    assert "pip wheel --no-deps -w dist ." in pathlib.Path(REPO, "BUILD.md").read_text()
    copied = copies(doc.steps)
    wheel = f"dist/{name}-*.whl"
    (dest,) = [d for sources, d in copied if wheel in sources]
    in_image = posixpath.join(dest, posixpath.basename(wheel)) if dest.endswith("/") else dest
    installs = [args for word, args in doc.steps if word == "RUN" and "pip install" in args]
    assert any(in_image in shlex.split(args) for args in installs), (in_image, installs)


def test_the_workdir_is_where_the_pods_run(doc):
    workdirs = [args for word, args in doc.steps if word == "WORKDIR"]
    assert workdirs == [k8s.DEFAULT_WORKDIR]
    assert {c["workingDir"] for c in doc.containers} == {k8s.DEFAULT_WORKDIR}
    assert f"`{k8s.DEFAULT_WORKDIR}`" in doc.section, "BUILD.md names the default"


def test_every_gin_file_and_module_is_copied_under_the_workdir(doc):
    copied = copies(doc.steps)
    own_gin = [
        g
        for g in doc.train.gin_file
        if not os.path.exists(os.path.join(PACKAGE_CONFIGS_DIR, g))  # the package ships these
    ]
    assert own_gin and doc.train.module, "the example has a gin file and a module of its own"
    for path in own_gin:
        assert not os.path.isabs(path), path
        assert image_path(copied, path) == posixpath.join(k8s.DEFAULT_WORKDIR, path), path
    for module in doc.train.module:
        base = module.replace(".", "/")
        places = {image_path(copied, f"{base}.py"), image_path(copied, f"{base}/__init__.py")}
        assert {
            posixpath.join(k8s.DEFAULT_WORKDIR, f"{base}.py"),
            posixpath.join(k8s.DEFAULT_WORKDIR, f"{base}/__init__.py"),
        } & places, f"--module={module} is not under {k8s.DEFAULT_WORKDIR}"


def test_the_entrypoint_is_the_containers_command(doc):
    (entrypoint,) = [json.loads(args) for word, args in doc.steps if word == "ENTRYPOINT"]
    assert {tuple(c["command"]) for c in doc.containers} == {tuple(entrypoint)}
    assert entrypoint == [k8s.TRAIN_COMMAND]
    assert k8s.TRAIN_COMMAND in _pyproject()["project"]["scripts"]


def test_the_image_built_is_the_image_emitted(doc):
    tag = re.search(r"docker build -t\s+(\S+)\s+\.", doc.section)
    assert tag, "BUILD.md shows the docker build command"
    assert tag.group(1) == doc.launch.image
    assert {c["image"] for c in doc.containers} == {doc.launch.image}


@pytest.mark.parametrize(
    "dockerfile, path, where",
    [
        ("WORKDIR /w\nCOPY gin/ gin/", "gin/a.gin", "/w/gin/a.gin"),
        ("WORKDIR /w\nCOPY gin/ ./", "gin/a.gin", "/w/a.gin"),  # a directory's contents
        ("WORKDIR /w\nCOPY m.py ./", "m.py", "/w/m.py"),
        ("WORKDIR /w\nCOPY m.py x.py", "m.py", "/w/x.py"),
        ("COPY . /w\nWORKDIR /w", "gin/a.gin", "/w/gin/a.gin"),
        ("WORKDIR /w\nCOPY gin/ gin/", "m.py", None),
        ("COPY m.py ./\nWORKDIR /w", "m.py", "/m.py"),  # copied before the WORKDIR
    ],
)
def test_copy_is_followed_as_docker_follows_it(dockerfile, path, where):
    assert image_path(copies(instructions(dockerfile)), path) == where
