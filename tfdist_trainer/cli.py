"""`tfdist-train`: one task of a cluster. Every task runs the same command.

The cluster comes from TF_CONFIG or from the classic flags. The chief (or a
lone process, or every multi_worker_mirrored worker) trains; ps and workers
under parameter_server serve; an evaluator follows checkpoints. All checks a
user can fail run before TensorFlow starts.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from tfdist_trainer import errors
from tfdist_trainer.errors import EXIT_CONFIG
from tfdist_trainer.io import markers
from tfdist_trainer.launch import quick_exit
from tfdist_trainer.plan.strategies import Action, help_text

FLAGS = flags.FLAGS

flags.DEFINE_multi_string("gin_file", [], "Gin config file; repeatable, later files win.")
flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin binding such as 'train.train_steps=100'; repeatable."
)
flags.DEFINE_alias("gin_param", "gin_bindings")
flags.DEFINE_multi_string(
    "module", [], "Python module to import before parsing gin (your Trainer); repeatable."
)
flags.DEFINE_string(
    "model_dir", None, "Checkpoints, logs and records of this job (shared by all tasks)."
)
flags.DEFINE_string(
    "job_name", None, "Classic cluster flags: this task's type (chief, worker, ps, evaluator)."
)
flags.DEFINE_alias("task_type", "job_name")
flags.DEFINE_integer("task_index", 0, "Classic cluster flags: this task's index within its type.")
flags.DEFINE_list(
    "ps_hosts", [], "Classic cluster flags: comma-separated host:port of the ps tasks."
)
flags.DEFINE_list(
    "worker_hosts", [], "Classic cluster flags: comma-separated host:port of the workers."
)
flags.DEFINE_string("chief_host", None, "Classic cluster flags: host:port of the chief.")
flags.DEFINE_string("evaluator_host", None, "Classic cluster flags: host:port of the evaluator.")
flags.DEFINE_string(
    "dispatcher_host",
    None,
    "Classic cluster flags: host:port of the tf.data service dispatcher. Only with "
    "parameter_server.data_service=True.",
)
flags.DEFINE_float(
    "startup_timeout_s", 120.0, "How long to wait for peer tasks before naming those missing."
)
flags.DEFINE_float(
    "chief_gone_grace_s",
    60.0,
    "How long a serving task waits for an unreachable chief (0: forever). A serving task gives "
    "up on a chief that has been unreachable this long without marking training done, and exits "
    "with the retryable code 201.",
)
flags.DEFINE_float(
    "preemption_grace_s",
    markers.DEFAULT_PREEMPTION_GRACE_S,
    "How long a preempted ps serves on for the chief to save its variables. A parameter_server "
    "ps that gets SIGTERM serves on until the chief has saved a checkpoint of its variables, at "
    "most this long; keep it below the time between SIGTERM and SIGKILL "
    "(Kubernetes: terminationGracePeriodSeconds, which tfdist-launch --emit=k8s sets from "
    "--k8s_grace_s, 60 s).",
)
flags.DEFINE_float(
    "evaluator_timeout_s",
    3600.0,
    "The evaluator gives up after this long without a new checkpoint.",
)


flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "evaluate", "export"],
    "train: what the task's role does in the cluster. evaluate: evaluate one checkpoint once "
    "(--checkpoint, default the newest in --model_dir), print and record the metrics. export: "
    "write a SavedModel with its serving signature from that checkpoint. Both run in this one "
    "process, without a cluster.",
)
flags.DEFINE_string(
    "checkpoint",
    None,
    "--mode=evaluate/export: a checkpoint prefix (default: --model_dir's newest).",
)
flags.DEFINE_string(
    "export_dir", None, "--mode=export: where to write (default: <model_dir>/export/<checkpoint>)."
)
flags.DEFINE_boolean(
    "console_chatter",
    False,
    "Also print TensorFlow's, CUDA's, matplotlib's and gin's known start-up lines on the console. "
    "Without it they go only to <model_dir>/logs/<task>.log (a local model_dir), with every "
    "other line; tfdist_trainer.launch.console says which lines.",
)


#: `tfdist-train --help`: the flags above, grouped (a flag in no group is listed under "other").
HELP_USAGE = f"""usage: tfdist-train --gin_file=... [--gin_bindings=...] --model_dir=... [cluster flags]

One task of a cluster; every task runs the same command. The cluster comes from TF_CONFIG
(Kubernetes, Kubeflow) or from the classic flags; a lone process needs neither.
{help_text()}"""
HELP_GROUPS = (
    (
        "what to run",
        ("gin_file", "gin_bindings", "module", "model_dir", "mode", "checkpoint", "export_dir"),
    ),
    (
        "the cluster (instead of TF_CONFIG)",
        (
            "job_name",
            "task_index",
            "chief_host",
            "worker_hosts",
            "ps_hosts",
            "evaluator_host",
            "dispatcher_host",
            "startup_timeout_s",
        ),
    ),
    ("fault tolerance", ("chief_gone_grace_s", "preemption_grace_s", "evaluator_timeout_s")),
    ("the console", ("console_chatter",)),
)
HELP_EXAMPLES = (
    "tfdist-train --gin_file=my_project/train.gin --gin_file=strategies/mirrored.gin "
    "--model_dir=/tmp/run1",
    "tfdist-train --job_name=worker --task_index=1 --chief_host=h0:2222 --ps_hosts=h1:2222 "
    "--worker_hosts=h2:2222,h3:2222 --gin_file=my_project/train.gin "
    "--gin_file=strategies/parameter_server.gin --model_dir=gs://bucket/run2",
)


def _fail(role: str, message: str, code: int, *, hard: bool = False) -> None:
    """Ends the task with one sentence and `code`: printed once (an absl error record of the
    same sentence before it read as a second failure); the task's log gets the same line.

    `hard` skips interpreter shutdown: after a stall, TF threads blocked on a
    silent peer would keep the process from ever exiting.
    """
    print(f"[{role}] error: {message}", file=sys.stderr, flush=True)
    if hard:
        logging.flush()
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str]) -> None:
    """One task: its checks, then its role's action (or one checkpoint under --mode)."""
    if len(argv) > 1:
        _fail(
            "tfdist-train",
            f"unexpected arguments {argv[1:]}; pass settings as --flags or --gin_bindings.",
            EXIT_CONFIG,
        )
    from tfdist_trainer.launch import task_console

    # Before anything imports TensorFlow: its start-up lines go to the task's log only.
    task_console.own_console(FLAGS.model_dir, chatter=FLAGS.console_chatter)
    from tfdist_trainer.launch import parent_watch
    from tfdist_trainer.plan import network

    parent_watch.end_with_launcher()
    if FLAGS.mode != "train":
        _checkpoint_mode(FLAGS.mode)
        return
    network.set_grpc_environment()
    prepared = _checked_task()
    _start_task(prepared)
    _run_task(prepared)


def _checked_task():
    """The task's cluster, gin configuration and peers, checked before TensorFlow starts: a
    mistake ends the task with one sentence and exit 2, under its role once the cluster names it."""
    from tfdist_trainer.plan import cluster as cluster_lib
    from tfdist_trainer.plan import preflight
    from tfdist_trainer.runtime.logs import set_role

    role = "tfdist-train"
    try:
        cluster = cluster_lib.resolve(
            os.environ,
            job_name=FLAGS.job_name,
            task_index=FLAGS.task_index,
            ps_hosts=FLAGS.ps_hosts,
            worker_hosts=FLAGS.worker_hosts,
            chief_host=FLAGS.chief_host,
            evaluator_host=FLAGS.evaluator_host,
            dispatcher_host=FLAGS.dispatcher_host,
        )
        role = cluster.role
        set_role(role)
        prepared = preflight.prepare(
            preflight.TRAIN_TASK,
            FLAGS.model_dir,
            FLAGS.gin_file,
            FLAGS.gin_bindings,
            FLAGS.module,
            cluster=cluster,
        )
        _wait_for_peers(prepared)
    except errors.ConfigError as e:
        _fail(role, str(e), EXIT_CONFIG)
    return prepared


def _run_task(prepared) -> None:
    """Runs the task's action and leaves at once; the package's own errors end it with one
    sentence and their exit code, anything else keeps its traceback."""
    from tfdist_trainer.runtime.config_checks import config_checks_are_config_errors
    from tfdist_trainer.runtime.peers import lost_peer_is_one_error

    action, cluster = prepared.action, prepared.cluster
    try:
        with lost_peer_is_one_error(), config_checks_are_config_errors():
            _run_action(action, prepared.experiment, cluster, prepared.strategy_config)
        _leave_without_teardown()
    except errors.TfdistError as e:
        # A serving task leaves without interpreter shutdown: with its TF server still running,
        # teardown sometimes crashed (exit 139 after the line saying 143; seen in make test).
        hard = e.hard_exit or action is Action.SERVE
        _fail(cluster.role, str(e).strip().splitlines()[0], e.exit_code, hard=hard)


def _leave_without_teardown() -> None:
    """Ends a task that finished its action: only the log is left to flush (`quick_exit.leave`).

    Tearing the interpreter down under a running TF server takes seconds, and sometimes crashed a
    serving task (exit 139 after the line saying 143). Under multi_worker_mirrored the leader's
    coordination service runs on through those seconds and finds the other tasks, already gone,
    missing heartbeats: "The following tasks are unhealthy (stopped sending heartbeats)" 6 s after
    the leader logged that it exits last, on a job that succeeded. Peers wait for this exit too
    (ps:0 for the serving tasks, the leader for every coordinated task): it ends with the port.
    A task of one process saves the same 0.8 s or more.
    """
    quick_exit.leave(0)


def _start_task(prepared) -> None:
    """What a checked task does before its action: TF_CONFIG as TensorFlow must read it, its
    model_dir, its log."""
    from tfdist_trainer.launch import task_console

    cluster, action, role = prepared.cluster, prepared.action, prepared.cluster.role
    # TensorFlow reads TF_CONFIG when the strategy is created: give it the normalized form.
    tf_config = cluster.to_tf_config() if action is not Action.EVALUATE else ""
    if tf_config:
        os.environ["TF_CONFIG"] = tf_config
    else:
        os.environ.pop("TF_CONFIG", None)
    try:
        prepared.create_model_dir()
    except errors.ConfigError as e:
        _fail(role, str(e), EXIT_CONFIG)
    task_console.log_to(prepared.model_dir, role.replace(":", "-"))
    logging.info("%s as %s under %s", action.value, role, prepared.strategy_config.name)
    if action is Action.EVALUATE:
        from tfdist_trainer.runtime import preemption

        preemption.stop_quietly_on_sigterm("the evaluator starts")


def _wait_for_peers(prepared) -> None:
    """Checks the task's own port, then waits for the peers its strategy needs (holding the port
    meanwhile where the strategy says so); a peer that never comes is one ConfigError."""
    from tfdist_trainer.plan import network

    cluster, strategy_config = prepared.cluster, prepared.strategy_config
    network.check_own_port(cluster)
    holder = None
    if strategy_config.holds_port_while_waiting and cluster.own_address is not None:
        holder = network.PortHolder(cluster.own_address.port)
    try:
        peers = strategy_config.peers(cluster)
        if peers:
            logging.info(
                "waiting up to %.0fs for %s",
                FLAGS.startup_timeout_s,
                ", ".join(p.name for p in peers),
            )
        network.wait_for_tasks(
            peers,
            timeout_s=FLAGS.startup_timeout_s,
            waiting_for=f" (waited for by {cluster.role})",
        )
    finally:
        if holder is not None:
            holder.close()


def _checkpoint_mode(mode: str) -> None:
    """--mode=evaluate or export: one checkpoint, in this process, whatever TF_CONFIG says."""
    from tfdist_trainer.launch import task_console
    from tfdist_trainer.plan import preflight
    from tfdist_trainer.runtime.logs import set_role

    role = "local"
    set_role(role)
    os.environ.pop("TF_CONFIG", None)  # no cluster: the model reads the checkpoint in this process
    try:
        prepared = preflight.prepare(
            preflight.CHECKPOINT_TASK,
            FLAGS.model_dir,
            FLAGS.gin_file,
            FLAGS.gin_bindings,
            FLAGS.module,
            before_gin=lambda: task_console.log_to(FLAGS.model_dir, mode),
        )
        from tfdist_trainer.runtime import checkpoint_actions

        if mode == "evaluate":
            checkpoint_actions.evaluate_checkpoint(
                prepared.experiment, prepared.model_dir, FLAGS.checkpoint
            )
        else:
            checkpoint_actions.export_checkpoint(
                prepared.experiment, prepared.model_dir, FLAGS.checkpoint, FLAGS.export_dir
            )
    except errors.TfdistError as e:
        _fail(role, str(e).strip().splitlines()[0], e.exit_code)


def _run_action(action, experiment, cluster, strategy_config) -> None:
    """The task's job: serve (ps, parameter_server worker, dispatcher), evaluate, or train."""
    if action is Action.SERVE:  # the strategy's serving tasks (parameter_server's ps, workers)
        from tfdist_trainer.runtime import strategies

        strategies.runtime_class(strategy_config.name).serve(
            cluster,
            FLAGS.model_dir,
            chief_gone_grace_s=FLAGS.chief_gone_grace_s,
            preemption_grace_s=FLAGS.preemption_grace_s,
        )
    elif action is Action.EVALUATE:
        from tfdist_trainer.runtime import evaluate

        evaluate.run_evaluator(
            experiment,
            FLAGS.model_dir,
            timeout_s=FLAGS.evaluator_timeout_s,
            context=strategy_config.task_context(cluster, FLAGS.model_dir),
        )
    else:
        from tfdist_trainer.runtime.train.controller import run_training

        run_training(experiment, cluster, FLAGS.model_dir)  # ends with the strategy's finish_job


def run() -> None:
    """Console-script entry point."""
    from tfdist_trainer.plan.gin_config import one_line_flags_parser

    app.run(
        main,
        flags_parser=one_line_flags_parser(
            "tfdist-train",
            EXIT_CONFIG,
            usage=HELP_USAGE,
            groups=HELP_GROUPS,
            examples=HELP_EXAMPLES,
        ),
    )


if __name__ == "__main__":
    run()
