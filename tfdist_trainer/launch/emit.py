"""--emit=k8s: the job's Kubernetes manifests instead of a local run."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.launch.flags import FLAGS
from tfdist_trainer.launch.say import error

#: k8s.manifests' keyword arguments (all but the job's own name, strategy and train_args) and the
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
    """k8s.manifests' keyword arguments from the flags: the one place where a flag's value, or
    its default, becomes the manifests' (tests/unit/test_k8s_defaults.py holds BUILD.md to it)."""
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
    from tfdist_trainer.plan.gin_config import load_experiment

    try:
        if FLAGS.num_workers < 0 or FLAGS.num_ps < 0:
            raise ConfigError("--num_workers and --num_ps must be >= 0.")
        if not settings.model_dir:
            raise ConfigError(
                "--model_dir is required after '--' (every pod needs the same shared one, e.g. "
                "gs://bucket/run1 or a path on --k8s_volume)."
            )
        if not FLAGS.image:
            raise ConfigError(
                "--image is required with --emit=k8s; name an image that has tfdist_trainer, "
                "your Trainer and your gin files installed."
            )
        k8s.check_train_args(train_args)
        k8s.parse_resources(FLAGS.cpu, FLAGS.memory, FLAGS.k8s_resources)  # before the gin files
        experiment = load_experiment(settings.gin_file, settings.gin_bindings, settings.module)
        name = FLAGS.k8s_name or k8s.dns_label(
            os.path.basename(os.path.normpath(settings.model_dir)) or "tfdist"
        )
        objects = k8s.manifests(
            strategy_config=experiment.strategy_config,
            name=name,
            train_args=train_args,
            **manifest_options(),
        )
    except ConfigError as e:  # ClusterConfigError, ManifestError, ResourceError are ConfigErrors
        error(str(e))
    text = k8s.to_yaml(objects) if FLAGS.k8s_format == "yaml" else k8s.to_json(objects)
    shared = settings.model_dir.startswith(("gs://", "s3://", "hdfs://")) or (
        FLAGS.k8s_volume
        and settings.model_dir.startswith(FLAGS.k8s_volume.partition(":")[2].rstrip("/") + "/")
    )
    notes = [
        f"{', '.join(o['kind'] for o in objects)} for {experiment.strategy_config.name}; apply with "
        f"kubectl apply -f"
    ]
    if not shared:
        notes.append(
            f"--model_dir {settings.model_dir} must be storage every pod shares (a bucket, or a path "
            f"under --k8s_volume)"
        )
    notes.extend(k8s.image_path_notes(settings.gin_file, settings.module, FLAGS.k8s_workdir))
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
