"""What one task does once the cluster is known: train, serve or evaluate.

`Experiment` holds the job-level knobs bound in gin as ``train.*``. The
training controller is deliberately small: build the state under the
strategy's scope, restore, then alternate `loop.train(n)` with reporting,
checkpoints and evaluation until the global step reaches ``train_steps``.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import gin
import keras
import tensorflow as tf
from absl import logging

from tfdist_trainer import data as data_lib
from tfdist_trainer import hooks as hooks_lib
from tfdist_trainer import layers
from tfdist_trainer import loops
from tfdist_trainer import storage
from tfdist_trainer import tf_compat
from tfdist_trainer.checkpoints import Checkpointer
from tfdist_trainer.cluster import CHIEF, WORKER, ClusterConfig, is_listening
from tfdist_trainer.logs import MetricsRecord, Summaries
from tfdist_trainer.strategies import OneDevice, StrategyConfig, as_strategy_config
from tfdist_trainer.trainer import Trainer
from tfdist_trainer.errors import ChiefLost, ClusterStalledError, ConfigError, EvaluatorTimeout, Preempted


#: Errors that mean another task of the cluster is gone (a ps under parameter_server,
#: a peer under multi_worker_mirrored); restarting the job from its checkpoint fixes them.
PEER_LOST_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                    tf.errors.DeadlineExceededError)


@gin.configurable("train")
class Experiment:
    """Job-level settings (gin: ``train.trainer_cls = @MyTrainer``, ``train.strategy = @mirrored``...).

    Args:
      trainer_cls: the user's Trainer subclass.
      strategy: one of @one_device, @mirrored, @multi_worker_mirrored, @parameter_server.
      train_steps: the global step at which training stops (exact under every strategy).
      steps_per_loop: steps per `tf.function` call (or per scheduled closure); None takes the
        strategy's default; 'auto' tunes it from measured throughput (up to the distance between
        hook boundaries such as log_every_n_steps).
      log_every_n_steps: progress, train-metric records and summaries.
      eval_every_n_steps: inline evaluation interval; None evaluates only at the end.
      checkpoint_every_n_steps: None saves only at the end (see CheckpointHook for time-based saves).
      keep_checkpoints: how many checkpoints to keep.
      extra_hooks: more hooks after the default ones, e.g. [@EarlyStopping(), @ExportSavedModel()].
      seed: seeds Python, NumPy and TF for reproducible runs; None leaves them random.
      jit_compile: compile each replica's train step with XLA.
      mixed_precision: None, 'mixed_bfloat16' or 'mixed_float16' (the latter with dynamic loss
        scaling: the optimizer is wrapped in keras.optimizers.LossScaleOptimizer).
    """

    def __init__(self, *, trainer_cls: type[Trainer] | None = None, strategy: Any = OneDevice,
                 train_steps: int = 1000, steps_per_loop: int | str | None = None,
                 log_every_n_steps: int = 100, eval_every_n_steps: int | None = None,
                 checkpoint_every_n_steps: int | None = 1000, keep_checkpoints: int = 3,
                 extra_hooks: Sequence[Any] = (), seed: int | None = None, jit_compile: bool = False,
                 mixed_precision: str | None = None):
        if trainer_cls is None:
            raise ConfigError("train.trainer_cls is not set; bind it in gin, e.g. train.trainer_cls = @MyTrainer.")
        if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
            raise ConfigError(f"train.trainer_cls must be a subclass of tfdist_trainer.Trainer, got {trainer_cls!r}.")
        for name, value in (("train_steps", train_steps), ("log_every_n_steps", log_every_n_steps),
                            ("keep_checkpoints", keep_checkpoints)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"train.{name} must be a positive integer, got {value!r}.")
        if mixed_precision not in (None, "mixed_bfloat16", "mixed_float16"):
            raise ConfigError(f"train.mixed_precision must be None, 'mixed_bfloat16' or 'mixed_float16', "
                             f"got {mixed_precision!r}.")
        if steps_per_loop == "auto":
            steps_per_loop_value = None
        elif isinstance(steps_per_loop, str):
            raise ConfigError(f"train.steps_per_loop must be a positive integer, 'auto' or None, got {steps_per_loop!r}.")
        else:
            steps_per_loop_value = steps_per_loop
        for name, value in (("steps_per_loop", steps_per_loop_value), ("eval_every_n_steps", eval_every_n_steps),
                            ("checkpoint_every_n_steps", checkpoint_every_n_steps)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"train.{name} must be a positive integer or None, got {value!r}.")
        self.trainer_cls = trainer_cls
        self.strategy_config: StrategyConfig = as_strategy_config(strategy)
        self.train_steps = train_steps
        self.auto_steps_per_loop = steps_per_loop == "auto"
        self.steps_per_loop = steps_per_loop_value or self.strategy_config.default_steps_per_loop
        self.jit_compile = jit_compile
        self.mixed_precision = mixed_precision
        self.keep_checkpoints = keep_checkpoints
        self.hooks = hooks_lib.default_hooks(
            log_every_n_steps=log_every_n_steps, checkpoint_every_n_steps=checkpoint_every_n_steps,
            eval_every_n_steps=eval_every_n_steps) + hooks_lib.as_hooks(extra_hooks)
        self.seed = seed


# -- state ---------------------------------------------------------------------

def _example_batch(trainer: Trainer) -> Any:
    """A one-example batch of zeros shaped like the training features, to build a lazy model."""
    spec = trainer.build_train_dataset(data_lib.single_pipeline_context()).element_spec
    features_spec = spec[0] if isinstance(spec, tuple) else spec

    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        return tf.zeros([1] + shape[1:], s.dtype)
    return tf.nest.map_structure(zeros, features_spec)


def build_model(trainer: Trainer, strategy_config: StrategyConfig | None = None) -> keras.Model:
    """Builds the user's model with all its variables, never lazily inside a step.

    Variables land where the current scope (or a model_parallel plan) places
    them only when they are created here, not when a `tf.function` first
    calls the model.
    """
    model = trainer.build_model()
    if strategy_config is not None:
        model = strategy_config.prepare_model(model)
    if not model.built:
        model(_example_batch(trainer), training=False)
    return model


def build_state(trainer: Trainer, strategy: tf.distribute.Strategy, *, with_optimizer: bool = True,
                strategy_config: StrategyConfig | None = None) -> tuple[tf.Variable, tf.train.Checkpoint]:
    """Creates model, optimizer, metrics and global step under the scope; returns (global_step, checkpoint)."""
    with strategy.scope(), layers.record_all_variables():
        # The placement scope lets self-sharding layers balance bytes against every variable.
        trainer.model = build_model(trainer, strategy_config)
        trainer.train_metrics = trainer.build_metrics()
        trainer.eval_metrics = [keras.metrics.Mean(name="loss")] + trainer.build_metrics()
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            tf_compat.make_metric_updates_atomic(trainer.train_metrics + trainer.eval_metrics)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        items = {"model": trainer.model, "global_step": global_step}
        if with_optimizer:
            trainer.optimizer = trainer.build_optimizer()
            if (keras.mixed_precision.global_policy().name == "mixed_float16"
                    and not isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)):
                # float16 gradients underflow without loss scaling; Trainer.train_step scales the loss.
                trainer.optimizer = keras.optimizers.LossScaleOptimizer(trainer.optimizer)
            trainer.optimizer.build(trainer.model.trainable_variables)
            items["optimizer"] = trainer.optimizer
    return global_step, tf.train.Checkpoint(**items)


def log_placement(trainer: Trainer) -> None:
    """Where every variable lives (variable, shape, bytes, device; bytes per device), once, on the chief."""
    variables = list(trainer.model.variables) + (list(trainer.optimizer.variables) if trainer.optimizer else [])
    logging.info("variable placement:\n%s", layers.placement_table(variables))


#: Above this many parameters the fingerprint is skipped: it would pull every table to this task.
FINGERPRINT_MAX_PARAMS = 50_000_000


def weights_fingerprint(model: keras.Model) -> str:
    """A short hash of this task's copy of the weights: synchronous workers must agree on it."""
    if model.count_params() > FINGERPRINT_MAX_PARAMS:
        return f"skipped ({model.count_params():,} parameters)"
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(weight.tobytes())
    return digest.hexdigest()[:16]


def trainer_tags(trainer: Trainer) -> dict[str, str]:
    tags = getattr(trainer, "record_tags", None)
    return dict(tags() if callable(tags) else tags or {})


# -- the run -------------------------------------------------------------------

class RunContext:
    """Everything a hook may touch during one training run of one task."""

    def __init__(self, *, experiment: Experiment, cluster: ClusterConfig, model_dir: str,
                 strategy: tf.distribute.Strategy, trainer: Trainer, global_step: tf.Variable,
                 checkpointer: Checkpointer, evaluator: loops.EvalLoop, synchronous_workers: bool):
        self.experiment = experiment
        self.cluster = cluster
        self.model_dir = model_dir
        self.strategy = strategy
        self.trainer = trainer
        self.global_step = global_step
        self.checkpointer = checkpointer
        self.evaluator = evaluator
        self.record = MetricsRecord(storage.join(model_dir, "metrics.jsonl"), enabled=cluster.is_chief)
        self.summaries = Summaries(model_dir, enabled=cluster.is_chief)
        self.tags = trainer_tags(trainer)
        self.target_step = experiment.train_steps
        self.step = int(global_step.numpy())
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.last_eval_step: int | None = None
        self._max_over_workers = _max_over_workers_fn(strategy) if synchronous_workers else None

    def refresh_step(self) -> None:
        self.step = int(self.global_step.numpy())

    def agree(self, flag: bool) -> bool:
        """True when `flag` is true on any synchronous worker, so all workers act together."""
        if self._max_over_workers is None:
            return flag
        return bool(self._max_over_workers(int(flag)))

    def log_info(self, fmt: str, *args) -> None:
        """Progress goes to the chief's log; other synchronous workers keep it at verbosity 1."""
        if self.cluster.is_chief:
            logging.info(fmt, *args)
        else:
            logging.vlog(1, fmt, *args)

    def take_train_metrics(self) -> dict[str, float]:
        values = loops.metric_values(self.trainer.train_metrics)
        for metric in self.trainer.train_metrics:
            metric.reset_state()
        return values

    def learning_rate(self) -> float | None:
        try:
            return float(keras.ops.convert_to_numpy(self.trainer.optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None

    def evaluate(self) -> dict[str, float]:
        if not self.evaluator.enabled:
            return {}
        values = {f"eval_{k}": v for k, v in self.evaluator.evaluate().items()}
        self.log_info("eval at step %d: %s%s", self.step, " ".join(f"{k}={v:.4f}" for k, v in values.items()),
                      hooks_lib.format_tags(self.tags))
        self.record.write(kind="eval", step=self.step, **values, **self.tags)
        self.summaries.scalars("eval", self.step, {k[len("eval_"):]: v for k, v in values.items()})
        self.last_eval, self.last_eval_step = values, self.step
        return values

    def export_saved_model(self, path: str) -> None:
        """Exports a copy of the model built outside any strategy, so it serves anywhere.

        The copy reads the latest checkpoint rather than `get_weights()`: sharded
        tables re-shard on restore, so the copy need not match the cluster's layout.
        """
        self.checkpointer.save(self.step)
        local = build_model(self.trainer)
        tf.train.Checkpoint(model=local).read(tf.train.latest_checkpoint(self.model_dir)).expect_partial()
        local.export(path, format="tf_saved_model", verbose=False)
        logging.info("exported a SavedModel with a serving signature to %s", path)

    def next_loop_end(self, hooks: Sequence[hooks_lib.Hook]) -> int:
        ends = [self.target_step] + [(self.step // h.every_n_steps + 1) * h.every_n_steps
                                     for h in hooks if h.every_n_steps]
        return min(ends)


def _max_over_workers_fn(strategy: tf.distribute.Strategy):
    """An int -> int function giving the maximum over all synchronous replicas (a collective)."""
    @tf.function
    def max_over_workers(value):
        votes = strategy.run(lambda: tf.reshape(value, [1]))
        return tf.reduce_max(strategy.gather(votes, axis=0))  # ReduceOp has no MAX

    return lambda value: int(max_over_workers(tf.constant(value, tf.int64)))


class _TerminationSignal:
    """Remembers a SIGTERM so the controller can save before the task exits."""

    def __init__(self):
        self.received = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        logging.warning("SIGTERM received: saving a checkpoint after the current loop, then exiting")
        self.received = True


def _write_run_config(run: RunContext) -> None:
    """The chief records the gin config and command line: text files and a TensorBoard text summary."""
    if not run.cluster.is_chief:
        return
    command = " ".join(sys.argv)
    config = gin.config_str()
    storage.write_text(storage.join(run.model_dir, "config.gin"), f"# command: {command}\n{config}")
    run.summaries.text("train", "config", f"command: `{command}`\n\n```\n{config}\n```")


def _write_operative_config(run: RunContext) -> None:
    """After training, gin knows which bindings were really used: save those too."""
    if run.cluster.is_chief:
        storage.write_text(storage.join(run.model_dir, "operative_config.gin"), gin.operative_config_str())


#: The longest a chief waits for its last checkpoint after the watchdog fired.
STALL_SAVE_TIMEOUT_S = 60.0


def _save_after_stall(run: RunContext, stalled: ClusterStalledError, timeout_s: float) -> str:
    """Saves what the finished closures counted when the cluster lets it; says what was kept.

    A save under parameter_server traces a new function, and TF registers every
    new function on every task of the cluster, holding the GIL until each has
    answered: with a silent worker the save would hang the chief for good. So
    no save is tried then, and the restarted chief resumes from the last
    periodic checkpoint. Otherwise the save runs in a thread the chief stops
    waiting for after `timeout_s`; a save cut short leaves a ``*_temp``
    directory that the next start removes.
    """
    run.refresh_step()
    kept = run.checkpointer.latest_step()
    kept_text = f"the last checkpoint (step {kept}) is kept" if kept is not None else "no checkpoint exists yet"
    if stalled.silent:
        return f"no checkpoint was written (a save must reach every worker); {kept_text}"
    outcome: list[str] = []

    def save():
        try:
            run.checkpointer.save(run.step)
            outcome.append(f"saved a checkpoint at step {run.step}")
        except (tf.errors.OpError, OSError) as e:
            outcome.append(f"no checkpoint could be written ({type(e).__name__}); {kept_text}")

    saver = threading.Thread(target=save, name="tfdist-stall-save", daemon=True)
    saver.start()
    saver.join(timeout_s)
    return outcome[0] if outcome else f"no checkpoint could be written within {timeout_s:g}s; {kept_text}"


def run_training(experiment: Experiment, cluster: ClusterConfig, model_dir: str) -> dict[str, Any]:
    """Trains until ``train.train_steps`` (or a hook stops it); returns the last train and eval values."""
    config = experiment.strategy_config
    if experiment.seed is not None:
        keras.utils.set_random_seed(experiment.seed)
    try:
        config.prepare_devices()
        strategy = config.create(cluster)
    except RuntimeError as e:  # "cannot be modified after being initialized", "must be configured at startup"
        raise ConfigError(
            f"TensorFlow was already running when the {config.name} strategy was set up ({str(e).strip()}); "
            f"a module imported by the gin config probably runs TensorFlow ops at import time: move them "
            f"into the Trainer's methods.") from None
    if experiment.jit_compile and (not config.supports_jit_compile or (
            strategy.num_replicas_in_sync > 1 and all("CPU" in d.upper() for d in strategy.extended.worker_devices))):
        raise ConfigError(
            f"train.jit_compile=True cannot run {config.name} over several devices of one process: XLA puts "
            f"every step on one device, away from variables on the others; use it with one_device, or "
            f"mirrored / multi_worker_mirrored on GPUs.")
    coordinator = config.create_coordinator(strategy)
    logging.info("strategy %s with %d replica(s) in sync", config.name, strategy.num_replicas_in_sync)

    if experiment.mixed_precision:
        keras.mixed_precision.set_global_policy(experiment.mixed_precision)
    trainer = experiment.trainer_cls()
    global_step, checkpoint = build_state(trainer, strategy, strategy_config=config)
    checkpointer = Checkpointer(model_dir=model_dir, cluster=cluster, checkpoint=checkpoint,
                                global_step=global_step, keep=experiment.keep_checkpoints)
    checkpointer.restore()
    if cluster.is_chief:
        log_placement(trainer)
    synchronous_workers = coordinator is None and not cluster.is_local
    steps_per_loop = experiment.steps_per_loop
    if experiment.auto_steps_per_loop:
        steps_per_loop = loops.StepsPerLoopTuner(
            initial=min(8, experiment.steps_per_loop),
            agree=_max_over_workers_fn(strategy) if synchronous_workers else None)
    if coordinator is None:
        loop = loops.TrainLoop(strategy, trainer, global_step, steps_per_loop, jit_compile=experiment.jit_compile,
                               step_fn=config.train_step_fn(trainer))
    else:
        loop = loops.ScheduledTrainLoop(strategy, coordinator, trainer, global_step, steps_per_loop,
                                        jit_compile=experiment.jit_compile, step_fn=config.train_step_fn(trainer),
                                        num_workers=cluster.num_tasks(WORKER),
                                        stall_timeout_s=config.stall_timeout_s,
                                        worker_addresses=[t.address for t in cluster.tasks((WORKER,))])
    run = RunContext(experiment=experiment, cluster=cluster, model_dir=model_dir, strategy=strategy,
                     trainer=trainer, global_step=global_step, checkpointer=checkpointer,
                     evaluator=loops.EvalLoop(trainer, strategy, distributed=coordinator is None),
                     synchronous_workers=synchronous_workers)
    termination = _TerminationSignal()
    hooks = experiment.hooks
    if cluster.is_chief:
        _mark_done(model_dir, None)
    _write_run_config(run)
    start_step, start_time = run.step, time.monotonic()
    for hook in hooks:
        hook.begin(run)
    try:
        while run.step < run.target_step:
            try:
                result = loop.train(run.next_loop_end(hooks) - run.step)
            except ClusterStalledError as stalled:
                saved = _save_after_stall(run, stalled, min(STALL_SAVE_TIMEOUT_S, config.stall_timeout_s))
                raise ClusterStalledError(
                    f"{stalled}; {saved}; exiting with code {ClusterStalledError.exit_code} (retryable): a restart "
                    f"policy (OnFailure or ExitCode) restarts the chief and the ps, which resume from the last "
                    f"checkpoint once the workers answer again.", stalled.silent) from None
            run.refresh_step()
            for hook in hooks:
                hook.after_loop(run, result)
            if run.agree(termination.received):
                checkpointer.save(run.step)
                raise Preempted(f"stopped by SIGTERM at step {run.step} after saving a checkpoint; "
                                f"run the same command again to resume.")
    except hooks_lib.StopTraining as stop:
        logging.info("stopping early: %s", stop)
    for hook in hooks:
        hook.end(run)
    _write_operative_config(run)
    if cluster.is_chief:
        _mark_done(model_dir, run.step)
    logging.info("training done at step %d in %.1fs (%d steps this run); weights fingerprint %s", run.step,
                 time.monotonic() - start_time, run.step - start_step, weights_fingerprint(trainer.model))
    return {"step": run.step, **run.last_train, **run.last_eval}


# -- serving (ps and workers under parameter_server) ---------------------------

def serve(cluster: ClusterConfig, model_dir: str, *, chief_gone_grace_s: float, poll_s: float = 1.0) -> None:
    """Runs this task's TF server until the chief marks training done in model_dir, then returns (exit 0).

    A chief that has been unreachable for `chief_gone_grace_s` (0: wait
    forever; a restarted chief comes back well within the default) raises
    ChiefLost: the job did not finish, so the task exits with a retryable code
    rather than 0, and Kubernetes or a launcher restarts it. Without this, ps
    and worker processes started by hand would outlive the job forever.
    """
    stale = _done_run_id(model_dir)  # a marker already there is an older run's
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.training_cluster()), job_name=cluster.task_type,
        task_index=cluster.task_id, protocol=cluster.rpc_layer, start=True)
    logging.info("serving at %s", server.target)
    chief = cluster.tasks((CHIEF,))[0]
    seen, gone_since, last_note = False, None, time.monotonic()
    while True:
        up = is_listening(chief, timeout=1.0)
        now = time.monotonic()
        if up:
            if not seen:
                logging.info("chief %s is up", chief.address)
            seen, gone_since = True, None
        if seen and _done_since(model_dir, stale):
            logging.info("the chief marked training done: exiting")
            return
        if not up and seen:
            gone_since = gone_since or now
            if chief_gone_grace_s > 0 and now - gone_since >= chief_gone_grace_s:
                raise ChiefLost(f"the chief at {chief.address} has been unreachable for {now - gone_since:.0f}s "
                                f"(--chief_gone_grace_s={chief_gone_grace_s:g}) and never marked training done; "
                                f"exiting with code {ChiefLost.exit_code} (retryable) so that a restart policy "
                                f"brings this task back for the restarted chief.")
        elif not up and now - last_note > 30:
            logging.info("waiting for the chief at %s", chief.address)
            last_note = now
        time.sleep(poll_s)


# -- the evaluator side-car -----------------------------------------------------

def run_evaluator(experiment: Experiment, model_dir: str, *, timeout_s: float) -> dict[str, float]:
    """Evaluates each new checkpoint in model_dir until training is over.

    Stops after the checkpoint at ``train_steps``, or after the last one when the
    chief marks training done earlier (a hook stopped it).
    """
    trainer = experiment.trainer_cls()
    global_step, checkpoint = build_state(trainer, tf.distribute.get_strategy(), with_optimizer=False)
    evaluator = loops.EvalLoop(trainer, None, distributed=False)
    if not evaluator.enabled:
        raise ConfigError(f"{type(trainer).__name__}.build_eval_dataset returned None; the evaluator has nothing to do.")
    record = MetricsRecord(storage.join(model_dir, "eval", "metrics.jsonl"))
    summaries = Summaries(model_dir, enabled=True)
    tags = trainer_tags(trainer)
    values: dict[str, float] = {}
    last_activity = time.monotonic()

    def finished() -> bool:
        done = _read_done(model_dir)
        if done is not None and done <= int(global_step.numpy()):
            return True
        if time.monotonic() - last_activity > timeout_s:
            raise EvaluatorTimeout(f"no new checkpoint appeared in {model_dir} for {timeout_s:g}s before step "
                               f"{experiment.train_steps}; is the chief running?")
        return False

    for path in tf.train.checkpoints_iterator(model_dir, min_interval_secs=1, timeout=2, timeout_fn=finished):
        checkpoint.restore(path).expect_partial()
        step = int(global_step.numpy())
        values = {f"eval_{k}": v for k, v in evaluator.evaluate().items()}
        logging.info("eval at step %d: %s%s", step, " ".join(f"{k}={v:.4f}" for k, v in values.items()),
                     hooks_lib.format_tags(tags))
        record.write(kind="eval", step=step, checkpoint=path, **values, **tags)
        summaries.scalars("eval", step, {k[len("eval_"):]: v for k, v in values.items()})
        last_activity = time.monotonic()
        if step >= experiment.train_steps:
            break
    return values


DONE_FILE = "training_done"


def _mark_done(model_dir: str, step: int | None) -> None:
    """The chief tells side-cars that no checkpoint after `step` will come (None: training restarts).

    The marker holds a fresh run id and the step, as JSON: serving tasks tell
    a new marker from an older run's by the id, never by comparing the file's
    time with their own clock (object stores have no reliable mtime, and hosts'
    clocks differ).
    """
    path = storage.join(model_dir, DONE_FILE)
    if step is None:
        storage.remove(path)
        return
    storage.write_text(path, json.dumps({"run_id": uuid.uuid4().hex, "step": int(step)}) + "\n")


def _read_marker(model_dir: str) -> dict | None:
    """The done marker as {"run_id", "step"}, or None when there is none (or it cannot be read)."""
    try:
        text = storage.read_text(storage.join(model_dir, DONE_FILE))
    except tf.errors.OpError:
        return None
    if text is None:
        return None
    try:
        marker = json.loads(text)
        if isinstance(marker, int):  # an older version wrote the bare step: an old run by definition
            return {"run_id": "", "step": marker}
        return {"run_id": str(marker["run_id"]), "step": int(marker["step"])}
    except (ValueError, TypeError, KeyError):
        return None


def _done_run_id(model_dir: str) -> str | None:
    marker = _read_marker(model_dir)
    return marker["run_id"] if marker else None


def _done_since(model_dir: str, stale: str | None) -> bool:
    """Whether the chief marked training done, other than in `stale` (the run id seen at start: an older run)."""
    run_id = _done_run_id(model_dir)
    return run_id is not None and run_id != stale


def _read_done(model_dir: str) -> int | None:
    """The step at which the chief marked training done, or None."""
    marker = _read_marker(model_dir)
    return marker["step"] if marker else None
