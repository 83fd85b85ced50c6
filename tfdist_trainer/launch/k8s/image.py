"""What the image must hold for the emitted pods: the gin files and modules their arguments name.

The launcher reads the gin files from its current directory; a pod reads them from its
workingDir (--k8s_workdir) in the image. A path that worked here then fails only in the
cluster, after the image is built and pushed, so the launcher says where the pods will look.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def image_path_notes(
    gin_files: Sequence[str], modules: Sequence[str], workdir: str | None
) -> list[str]:
    """The launcher's notes on where the pods look for `gin_files` and `modules` (none: nothing to say).

    A relative gin file found here (not one of the package's own, which gin finds by name) and
    every module resolve from `workdir`, or from the image's WORKDIR when it is empty; an
    absolute gin file must be at that very path in the image.
    """
    relative = [p for p in gin_files if not os.path.isabs(p) and os.path.exists(p)]
    absolute = [p for p in gin_files if os.path.isabs(p)]
    notes = []
    if relative or modules:
        where = f"workingDir {workdir} (--k8s_workdir)" if workdir else "image's WORKDIR"
        names = [*relative, *(f"module {m}" for m in modules)]
        notes.append(
            f"the pods look for {', '.join(names)} in their {where}, not here: the image needs "
            f"them there (BUILD.md, Kubernetes, The image)"
        )
    if absolute:
        notes.append(f"{', '.join(absolute)} must be at that path in the image")
    return notes
