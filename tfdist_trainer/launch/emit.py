"""--emit=k8s: the job's Kubernetes manifests instead of a local run."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.launch.flags import FLAGS
from tfdist_trainer.launch.say import error
from tfdist_trainer.plan import preflight

#: k8s.JobSpec's settings (all but the job's own name, strategy and train_args) and the
#: tfdist-launch flag that gives each.
OPTION_FLAGS = {
    "image": "image",
    "flavor": "k8s_flavor",
    "num_workers": "num_workers",
    "num_ps": "num_ps",
    "evaluator": "evaluator",
    "namespace": "k8s_namespace",
    "cpu": "cpu",
    "memory": "memory",
    "resources": "k8s_resources",
    "gpus": "gpus",
    "port": "k8s_port",
    "restart_policy": "restart_policy",
    "backoff_limit": "backoff_limit",
    "grace_s": "k8s_grace_s",
    "volume": "k8s_volume",
    "image_pull_policy": "image_pull_policy",
    "workdir": "k8s_workdir",
}


def manifest_options() -> dict[str, Any]:
    """k8s.JobSpec's settings from the flags: the one place where a flag's value, or its default,
    becomes the manifests' (tests/unit/test_k8s_defaults.py holds BUILD.md to it)."""
    from tfdist_trainer.launch import k8s

    options = {arg: FLAGS[flag].value for arg, flag in OPTION_FLAGS.items()}
    options["resources"] = list(options["resources"])
    if not FLAGS["restart_policy"].present:
        # A local run's default (Never) would leave a preempted pod down.
        options["restart_policy"] = k8s.DEFAULT_RESTART_POLICY
    return options


def emit_manifests(train_args: list[str], settings: argparse.Namespace) -> None:
    """--emit=k8s: writes the job's Kubernetes manifests; starts nothing."""
    from tfdist_trainer.launch import k8s

    try:
        preflight.check_task_counts(FLAGS.num_workers, FLAGS.num_ps)
        prepared = preflight.prepare(
            preflight.EMIT,
            settings.model_dir,
            settings.gin_file,
            settings.gin_bindings,
            settings.module,
            before_gin=lambda: _check_before_gin(train_args),
        )
        spec = k8s.JobSpec(
            strategy_config=prepared.strategy_config,
            name=FLAGS.k8s_name
            or k8s.dns_label(os.path.basename(os.path.normpath(settings.model_dir)) or "tfdist"),
            train_args=train_args,
            **manifest_options(),
        )
        objects = k8s.manifests(spec)
    except ConfigError as e:  # ClusterConfigError, ManifestError, ResourceError are ConfigErrors
        error(str(e))
    notes = _notes(objects, spec, settings)
    _write(k8s.to_yaml(objects) if FLAGS.k8s_format == "yaml" else k8s.to_json(objects), notes)


def _check_before_gin(train_args: list[str]) -> None:
    """What the manifests need that reading the gin files (slow: the user's modules) cannot fix."""
    from tfdist_trainer.launch import k8s

    k8s.check_image(FLAGS.image)
    k8s.check_train_args(train_args)
    k8s.parse_resources(FLAGS.cpu, FLAGS.memory, FLAGS.k8s_resources)


def _notes(objects: list[dict[str, Any]], spec, settings: argparse.Namespace) -> list[str]:
    """What the user reads on stderr after the manifests: what they are, and what to check."""
    from tfdist_trainer.launch import k8s

    shared = settings.model_dir.startswith(("gs://", "s3://", "hdfs://")) or (
        FLAGS.k8s_volume
        and settings.model_dir.startswith(FLAGS.k8s_volume.partition(":")[2].rstrip("/") + "/")
    )
    notes = [
        f"{', '.join(o['kind'] for o in objects)} for {spec.strategy_config.name}; apply with "
        f"kubectl apply -f"
    ]
    if not shared:
        notes.append(
            f"--model_dir {settings.model_dir} must be storage every pod shares (a bucket, or a path "
            f"under --k8s_volume)"
        )
    notes.extend(k8s.image_path_notes(settings.gin_file, settings.module, FLAGS.k8s_workdir))
    return notes


def _write(text: str, notes: list[str]) -> None:
    """The manifests to --emit_file or stdout, then the notes to stderr."""
    if FLAGS.emit_file:
        try:
            with open(FLAGS.emit_file, "w") as f:
                f.write(text)
        except OSError as e:
            error(
                f"--emit_file {FLAGS.emit_file} cannot be written ({e.strerror}); pick another path."
            )
        notes[0] = f"wrote {FLAGS.emit_file}: " + notes[0]
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    for note in notes:
        print(f"[launch] {note}", file=sys.stderr, flush=True)
