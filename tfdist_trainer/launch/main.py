"""`tfdist-launch`: a whole cluster on this machine, one process per task, torn down cleanly.

    tfdist-launch --num_workers=2 --num_ps=1 [--evaluator] -- --gin_file=... --model_dir=...

The strategy (read from the same gin files the tasks use) decides which tasks
exist: parameter_server starts a chief, workers and ps; multi_worker_mirrored
starts workers only; one_device and mirrored a single process. Each task gets
its own TF_CONFIG with a free port on 127.0.0.1, its output is prefixed with
its role and copied to ``model_dir/logs/<role>.log``. The launcher exits with
the job's exit code and never leaves a process behind: tasks run in their
own process groups and get SIGTERM, then SIGKILL after a grace period
(a multi_worker_mirrored task ignores SIGTERM).

With ``--private_network`` the whole cluster runs in a fresh network
namespace that holds only a loopback device (tfdist_trainer.launch.netns): the
tasks' gRPC ports, which have no authentication, cannot be reached from the
host's network. The launcher creates the namespace, runs itself inside it,
and deletes it when the job ends, fails or is interrupted.

With ``--emit=k8s`` nothing runs: the launcher writes the Kubernetes
manifests of the same job (tfdist_trainer.launch.k8s) to stdout or ``--emit_file``."""

from __future__ import annotations

import argparse
import signal
import sys

from absl import app

from tfdist_trainer.errors import EXIT_CONFIG, ConfigError
from tfdist_trainer.io import storage
from tfdist_trainer.launch import (
    console,
    emit,
    local_tasks,
    private_network,
    quick_exit,
    supervisor,
)
from tfdist_trainer.launch.flags import FLAGS, passthrough_settings
from tfdist_trainer.launch.restart_budget import RestartBudget
from tfdist_trainer.launch.say import error, say
from tfdist_trainer.plan import preflight


class _Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise _Interrupted(signum)


def _keep_line():
    """Which of the launcher's own stderr lines reach the console: all with --console_chatter."""
    return (lambda line: True) if FLAGS.console_chatter else console.ConsoleFilter()


def main(argv: list[str]) -> None:
    train_args = argv[1:]
    settings = passthrough_settings(train_args)
    if FLAGS.emit:
        with console.quiet_stderr(_keep_line()):  # the manifests go to stdout, never filtered
            emit.emit_manifests(train_args, settings)
        return
    if FLAGS.private_network and not FLAGS.in_private_network:
        sys.exit(private_network.run_in_private_network(train_args))
    if FLAGS.in_private_network:
        from tfdist_trainer.launch import netns

        netns.bring_loopback_up()  # `ip netns add` set it up already; `unshare -n` did not
    local = _local_cluster(train_args, settings)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    say(f"{local.strategy_config.name}: {', '.join(t.role for t in local.tasks)}")
    code = 1
    try:
        local.start()
        code = local.wait(FLAGS.startup_timeout_s)
    except _Interrupted as e:
        say(f"received {signal.Signals(e.signum).name}; stopping the cluster")
        code = 128 + e.signum
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        local.stop(settle_s=FLAGS.grace_s if code == 0 else 0.0)
        local.report_late_failures()
    incomplete = (
        f" (evaluation incomplete: {', '.join(local.given_up)} stopped early)"
        if local.given_up
        else ""
    )
    say(f"job {'succeeded' if code == 0 else f'failed with exit code {code}'}{incomplete}")
    quick_exit.leave(code)  # the job is over: TF's teardown in this process took 0.8 s more


def _local_cluster(train_args: list[str], settings: argparse.Namespace) -> supervisor.LocalCluster:
    """The job's tasks on this machine, checked (one sentence and exit 2 for a bad input), with its
    model_dir and logs created; nothing started."""
    try:
        preflight.check_task_counts(FLAGS.num_workers, FLAGS.num_ps)
        prepared = _prepared_quietly(settings)
        strategy_config = prepared.strategy_config
        policy = supervisor.RestartPolicy(FLAGS.restart_policy, FLAGS.backoff_limit)
        budget = RestartBudget(FLAGS.backoff_limit, FLAGS.backoff_window_s, FLAGS.restart_backoff_s)
        min_workers = supervisor.elastic_min_workers(
            strategy_config, FLAGS.min_workers, FLAGS.num_workers
        )
        tasks, cluster = local_tasks.plan_tasks(
            strategy_config,
            num_workers=FLAGS.num_workers,
            num_ps=FLAGS.num_ps,
            evaluator=FLAGS.evaluator,
            host=FLAGS.host,
        )
        logs = _create_run_dirs(prepared)
    except ConfigError as e:  # ClusterConfigError included
        error(str(e))
    local = supervisor.LocalCluster(
        tasks,
        cluster,
        train_args,
        logs,
        grace_s=FLAGS.grace_s,
        strategy_config=strategy_config,
        policy=policy,
        budget=budget,
        min_workers=min_workers,
        model_dir=prepared.model_dir,
    )
    local.console_chatter = FLAGS.console_chatter
    local.console_format = FLAGS.console_format
    return local


def _prepared_quietly(settings: argparse.Namespace) -> preflight.Prepared:
    """The launch's preflight, with TensorFlow's start-up lines kept off the console: checking
    model_dir (tf.io.gfile) and the user's Trainer both import TensorFlow, and its lines are the
    same every task writes to its log."""
    with console.quiet_stderr(_keep_line()):
        return preflight.prepare(
            preflight.LAUNCH,
            settings.model_dir,
            settings.gin_file,
            settings.gin_bindings,
            settings.module,
        )


def _create_run_dirs(prepared: preflight.Prepared) -> str:
    """Creates model_dir and its logs directory, user-only even if model_dir existed; returns the
    logs directory. A model_dir that cannot hold one is a ConfigError."""
    prepared.create_model_dir()
    logs = storage.join(prepared.model_dir, "logs")
    try:
        storage.make_private_dir(logs)
    except OSError as e:
        raise ConfigError(
            f"--model_dir {prepared.model_dir} cannot be used as a directory "
            f"({e.strerror or e}); pick another path."
        ) from None
    return logs


def run() -> None:
    """Console-script entry point.

    The console is line-buffered whatever it is: Python block-buffers a pipe or a file, and
    `tfdist-launch ... | tee run.txt` showed nothing for the first seconds, then bursts.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    from tfdist_trainer.launch import flags as launch_flags
    from tfdist_trainer.plan.gin_config import one_line_flags_parser

    app.run(
        main,
        flags_parser=one_line_flags_parser(
            "launch",
            EXIT_CONFIG,
            usage=launch_flags.HELP_USAGE,
            groups=launch_flags.HELP_GROUPS,
            examples=launch_flags.HELP_EXAMPLES,
        ),
    )


if __name__ == "__main__":
    run()
