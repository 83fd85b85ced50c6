"""BUILD.md's Kubernetes section as the tests read it: its flag table and its code blocks.

The tests that hold BUILD.md to the manifests (test_k8s_defaults, test_k8s_image) parse the
text a user reads, so a default or an example changed in one place and not the other fails.
"""

from __future__ import annotations

import os
import re

from clusterlib import REPO


def kubernetes_section() -> str:
    """BUILD.md from '## Kubernetes' up to the next '## ' heading."""
    with open(os.path.join(REPO, "BUILD.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## Kubernetes\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def flag_table(section: str) -> dict[str, str]:
    """`--flag` -> its documented default, from the '| flag | default | meaning |' table.

    A row that documents several flags ('`--a`, `--b` | 1, 2') pairs them in order, or gives
    them all its one default ('`--a`, `--b` | none'); backticks are dropped ('`tfjob`' -> 'tfjob').
    """
    lines = section.splitlines()
    start = lines.index("| flag | default | meaning |")
    defaults: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        flags_cell, default_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        names = re.findall(r"`(--[a-z0-9_]+)`", flags_cell)
        values = default_cell.split(", ") if len(names) > 1 else [default_cell]
        if len(values) == 1:
            values *= len(names)
        assert len(values) == len(names), f"one default, or one per flag: {line}"
        defaults.update(zip(names, (v.replace("`", "") for v in values)))
    return defaults


def code_blocks(section: str, language: str) -> list[str]:
    """The ```language blocks of `section`, in order, without their fences."""
    return re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.M | re.S)
