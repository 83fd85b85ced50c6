"""tfdist-launch's flags, and the settings it reads from the tasks' own arguments (after `--`)."""

from __future__ import annotations

import argparse

from absl import flags

from tfdist_trainer.io.markers import DEFAULT_PREEMPTION_GRACE_S
from tfdist_trainer.launch.k8s.job import (
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_GRACE_S,
    DEFAULT_RESTART_POLICY,
    DEFAULT_WORKDIR,
)
from tfdist_trainer.plan.strategies import help_text

FLAGS = flags.FLAGS

flags.DEFINE_integer("num_workers", 2, "Worker tasks (parameter_server, multi_worker_mirrored).")
flags.DEFINE_integer("num_ps", 1, "Parameter-server tasks (parameter_server only).")
flags.DEFINE_boolean(
    "evaluator", False, "Also start an evaluator side-car that follows checkpoints."
)
flags.DEFINE_string("host", "127.0.0.1", "Address the tasks listen on.")
flags.DEFINE_float("startup_timeout_s", 120.0, "How long a task may take to start listening.")
flags.DEFINE_float("grace_s", 10.0, "Seconds between SIGTERM and SIGKILL at teardown.")
flags.DEFINE_enum(
    "restart_policy",
    "Never",
    ["Never", "OnFailure", "ExitCode"],
    "Like Kubeflow: restart failed tasks never, on any failure, or on exit codes 128-255. "
    f"With --emit=k8s the default is {DEFAULT_RESTART_POLICY}.",
)
flags.DEFINE_boolean(
    "console_chatter",
    False,
    "Also print TensorFlow's known start-up and shutdown lines on the console. The per-task logs "
    "always have every line; tfdist_trainer.launch.console says which lines.",
)
flags.DEFINE_enum(
    "console_format",
    "short",
    ["short", "absl"],
    "How task lines look on the console. short: '[chief:0] 10:06:13 W message' (the time; the "
    "level only for warnings and errors); absl: absl's whole header (level, date, time, thread, "
    "file:line). The per-task logs always keep absl's.",
)
flags.DEFINE_integer(
    "backoff_limit",
    DEFAULT_BACKOFF_LIMIT,
    "Restarts allowed within any --backoff_window_s before the job fails (spaced faults never add "
    "up; a crash loop spends them in minutes).",
)
flags.DEFINE_float(
    "backoff_window_s",
    300.0,
    "The window --backoff_limit counts restarts in, in seconds (> 0).",
)
flags.DEFINE_integer(
    "min_workers",
    None,
    "multi_worker_mirrored: go on with at least this many workers when one fails for good. When "
    "a worker fails past the restart policy, the others go on from the last checkpoint (same "
    "global batch) as long as at least this many are left. "
    "Default: multi_worker_mirrored.min_workers from gin (none: the job fails).",
)
flags.DEFINE_float(
    "restart_backoff_s",
    1.0,
    "Delay before a task's first restart; doubles with each of its restarts (up to 300 s) and "
    "starts over once it has run for 120 s.",
)
# -- security: a private network for the local cluster
flags.DEFINE_boolean(
    "private_network",
    False,
    "Run every task in a fresh network namespace that has only loopback. The tasks' "
    "unauthenticated gRPC ports then cannot be reached from this host's network.",
)
flags.DEFINE_enum(
    "private_network_via",
    "auto",
    ["auto", "netns", "unshare"],
    "How to make the private network (auto: netns, else unshare). netns: root and iproute2 "
    "(`ip netns`); unshare: an unprivileged user + network namespace (`unshare -rn`).",
)
flags.DEFINE_boolean(
    "in_private_network",
    False,
    "Internal: set by --private_network on the launcher it starts inside the namespace.",
)
# -- Kubernetes manifests instead of a local run
flags.DEFINE_enum(
    "emit", None, ["k8s"], "Write Kubernetes manifests of this job instead of running it."
)
flags.DEFINE_string("emit_file", None, "Write the manifests to this file instead of stdout.")
flags.DEFINE_enum(
    "k8s_flavor",
    "tfjob",
    ["tfjob", "indexed", "jobset"],
    "Which Kubernetes objects (BUILD.md, Kubernetes, compares them). tfjob: a Kubeflow TFJob "
    "(training-operator 1.9); indexed: plain Kubernetes (an Indexed Job per task type and a "
    "headless Service); jobset: one JobSet (kubernetes-sigs/jobset), with set-level restarts.",
)
flags.DEFINE_integer(
    "k8s_grace_s",
    DEFAULT_GRACE_S,
    "terminationGracePeriodSeconds of every pod: what a preempted task has between SIGTERM and "
    f"SIGKILL to save. Must exceed the tasks' --preemption_grace_s "
    f"({DEFAULT_PREEMPTION_GRACE_S:g}).",
)
flags.DEFINE_enum("k8s_format", "yaml", ["yaml", "json"], "Manifest format (json: one v1 List).")
flags.DEFINE_string(
    "image", None, "Container image with tfdist_trainer, your Trainer and your gin files."
)
flags.DEFINE_string(
    "image_pull_policy", None, "imagePullPolicy of the containers (Always, IfNotPresent, Never)."
)
flags.DEFINE_string(
    "k8s_name", None, "Name of the job's Kubernetes objects (default: from --model_dir)."
)
flags.DEFINE_string(
    "k8s_namespace", None, "Kubernetes namespace of the objects (default: kubectl's)."
)
flags.DEFINE_string("cpu", None, "CPU request of every task, e.g. '4'.")
flags.DEFINE_string("memory", None, "Memory request and limit of every task, e.g. '8Gi'.")
flags.DEFINE_multi_string(
    "k8s_resources",
    [],
    "ROLE:cpu=N,memory=M: one role's CPU request and memory request (= limit) instead of "
    "--cpu/--memory, e.g. ps:memory=64Gi or worker:cpu=8,memory=16Gi; repeat for other roles "
    "(chief, worker, ps, evaluator, dispatcher).",
)
flags.DEFINE_string(
    "k8s_workdir",
    DEFAULT_WORKDIR,
    "The containers' workingDir: relative --gin_file paths and --module names after '--' "
    "resolve from it, as they do from the directory tfdist-launch runs in, so the image must "
    "have them there (BUILD.md, Kubernetes, has a Dockerfile). Empty: the image's own WORKDIR.",
)
flags.DEFINE_integer(
    "gpus",
    0,
    "GPUs (nvidia.com/gpu) of every task that runs steps. Not of a ps, nor of a "
    "parameter_server chief.",
)
flags.DEFINE_integer("k8s_port", 2222, "The tasks' gRPC port in the pods.")
flags.DEFINE_string(
    "k8s_volume",
    None,
    "CLAIM:/mount/path: a PersistentVolumeClaim mounted in every pod (for a shared --model_dir).",
)

#: The launcher's own flags that a launcher inside the private network gets again.
FORWARDED_FLAGS = (
    "num_workers",
    "num_ps",
    "evaluator",
    "host",
    "startup_timeout_s",
    "grace_s",
    "restart_policy",
    "backoff_limit",
    "min_workers",
    "restart_backoff_s",
    "backoff_window_s",
    "console_chatter",
    "console_format",
)

#: `tfdist-launch --help`: the flags above, grouped (a flag in no group is listed under "other").
HELP_USAGE = f"""usage: tfdist-launch [flags] -- [tfdist-train flags: --gin_file=... --model_dir=...]

A whole cluster on this machine, one process per task; the strategy in the gin files decides
which tasks. Everything after '--' goes to every task (tfdist-train --help lists it).
{help_text()}"""
HELP_GROUPS = (
    (
        "the cluster",
        (
            "num_workers",
            "num_ps",
            "evaluator",
            "host",
            "startup_timeout_s",
            "grace_s",
            "private_network",
            "private_network_via",
        ),
    ),
    (
        "fault tolerance",
        ("restart_policy", "backoff_limit", "backoff_window_s", "restart_backoff_s", "min_workers"),
    ),
    ("the console", ("console_format", "console_chatter")),
    (
        "Kubernetes (manifests instead of a run)",
        (
            "emit",
            "emit_file",
            "k8s_flavor",
            "image",
            "image_pull_policy",
            "k8s_name",
            "k8s_namespace",
            "k8s_workdir",
            "cpu",
            "memory",
            "k8s_resources",
            "gpus",
            "k8s_port",
            "k8s_volume",
            "k8s_grace_s",
            "k8s_format",
        ),
    ),
)
HELP_EXAMPLES = (
    "tfdist-launch --num_workers=2 --num_ps=1 --evaluator -- --gin_file=my_project/train.gin "
    "--gin_file=strategies/parameter_server.gin --model_dir=/tmp/run2",
    "tfdist-launch --emit=k8s --image=registry.example.com/me/train:1 --k8s_volume=runs:/runs -- "
    "--gin_file=my_project/train.gin --gin_file=strategies/multi_worker_mirrored.gin "
    "--model_dir=/runs/run3",
)


def passthrough_settings(train_args: list[str]) -> argparse.Namespace:
    """Reads the gin files, bindings, modules and model_dir the tasks will get."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--gin_file", action="append", default=[])
    parser.add_argument("--gin_bindings", "--gin_param", action="append", default=[])
    parser.add_argument("--module", action="append", default=[])
    parser.add_argument("--model_dir")
    settings, _ = parser.parse_known_args(train_args)
    return settings
