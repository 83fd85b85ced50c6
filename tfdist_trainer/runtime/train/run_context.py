"""RunContext: everything a hook may touch during one training run of one task.

The controller builds it once the state is restored; hooks receive it in
`begin`, `after_loop` and `end`. Hooks never import TensorFlow: what they do
to the model (evaluate, save, export, read memory) goes through here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf
from absl import logging

from tfdist_trainer import sharding
from tfdist_trainer.hooks import Hook
from tfdist_trainer.io import storage
from tfdist_trainer.io.records import EVALUATOR_JOURNAL, MetricsRecord, read_records
from tfdist_trainer.plan.cluster import EVALUATOR, ClusterConfig
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.runtime import ema, export, loops, memory
from tfdist_trainer.runtime.checkpoints import Checkpointer, FinalSave
from tfdist_trainer.runtime.logs import Summaries, report_eval, trainer_tags
from tfdist_trainer.trainers.trainer import Trainer


class RunContext:
    """Everything a hook may touch during one training run of one task (`hooks.Run`)."""

    def __init__(
        self,
        *,
        experiment: Experiment,
        cluster: ClusterConfig,
        model_dir: str,
        strategy: tf.distribute.Strategy,
        trainer: Trainer,
        global_step: tf.Variable,
        checkpointer: Checkpointer,
        evaluator: loops.EvalLoop,
        max_over_workers: Callable[[int], int] | None,
    ):
        self.experiment = experiment
        self.cluster = cluster
        self.model_dir = model_dir
        self.strategy = strategy
        self.trainer = trainer
        self.global_step = global_step
        self.checkpointer = checkpointer
        self.evaluator = evaluator
        self.record = MetricsRecord(
            storage.join(model_dir, "metrics.jsonl"), enabled=cluster.is_chief
        )
        self.summaries = Summaries(model_dir, enabled=cluster.is_chief)
        self.tags = trainer_tags(trainer)
        self.target_step = experiment.loop.train_steps
        self.step = int(global_step.numpy())
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.last_eval_step: int | None = None
        #: Every evaluation this run has seen so far, oldest first: (step, {eval_<name>: value}).
        self.evaluations: list[tuple[int, dict[str, float]]] = []
        #: Whether the cluster has an evaluator task: then it evaluates, and the training tasks do not.
        self.has_evaluator_task = cluster.num_tasks(EVALUATOR) > 0
        # The evaluator's results up to the restored step were this run's predecessor's.
        self._evaluator_step = self.step
        #: An int -> int maximum over the synchronous workers (a collective); None: no peers.
        self.max_over_workers = max_over_workers

    def refresh_step(self) -> None:
        self.step = int(self.global_step.numpy())

    def agree(self, flag: bool) -> bool:
        """True when `flag` is true on any synchronous worker, so all workers act together."""
        if self.max_over_workers is None:
            return flag
        return bool(self.max_over_workers(int(flag)))

    def log_info(self, fmt: str, *args) -> None:
        """Progress goes to the chief's log; other synchronous workers keep it at verbosity 1."""
        if self.cluster.is_chief:
            logging.info(fmt, *args)
        else:
            logging.vlog(1, fmt, *args)

    def take_train_metrics(self) -> dict[str, float]:
        """The train metrics since the last call (and the gradient norm with clipping on), reset."""
        metrics = list(self.trainer.train_metrics)
        if self.trainer.gradient_norm is not None:
            metrics.append(self.trainer.gradient_norm)
        values = loops.metric_values(metrics)
        for metric in metrics:
            metric.reset_state()
        return values

    def table_counters(self) -> dict[str, float]:
        """The dynamic tables' counters (rows in use, admitted, evicted, expired); {} without any.

        Read from the tables' devices when a train record is written: they are
        state, not metrics of the interval, so nothing is reset.
        """
        if self.trainer.model is None:
            return {}
        return sharding.dynamic_table_stats(self.trainer.model)

    def learning_rate(self) -> float | None:
        try:
            return float(keras.ops.convert_to_numpy(self.trainer.optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None

    def evaluate(self) -> dict[str, float]:
        """Evaluates inline (every synchronous worker together) and records it; {} without eval data."""
        if not self.evaluator.enabled:
            return {}
        with ema.averaged_weights(self.trainer):  # the optimizer's averages, if it keeps them
            metrics = self.evaluator.evaluate()
        values = report_eval(
            metrics,
            step=self.step,
            tags=self.tags,
            record=self.record,
            summaries=self.summaries,
            log=self.log_info,
            evaluated_by="chief",
        )
        self._saw_evaluation(self.step, values)
        return values

    def take_evaluator_results(self) -> None:
        """Takes the evaluations the evaluator task has journaled since the last call.

        The chief copies them into metrics.jsonl, so that it holds every
        evaluation whoever made it; `last_eval` and `evaluations` follow them on
        every training task (EarlyStopping reads them). Synchronous workers read
        the journal at slightly different times, so they agree to act on the
        evaluations all of them have read.
        """
        journaled = [
            r
            for r in read_records(storage.join(self.model_dir, EVALUATOR_JOURNAL))
            if r.get("kind") == "eval"
        ]
        count = len(journaled)
        if self.max_over_workers is not None:
            count = -self.max_over_workers(-count)  # the fewest read by any worker
        for r in journaled[:count]:
            if r["step"] > self._evaluator_step:
                self._evaluator_step = r["step"]
                self._saw_evaluation(
                    r["step"], {k: v for k, v in r.items() if k.startswith("eval_")}
                )
        self.record.add_missing(journaled[:count])

    def _saw_evaluation(self, step: int, values: dict[str, float]) -> None:
        self.last_eval, self.last_eval_step = values, step
        self.evaluations.append((step, values))

    def save_checkpoint(self, *, durable: bool = False) -> None:
        """Saves a checkpoint of this step: the one place a training task asks for a save.

        Every protocol asks here (`CheckpointHook`, `EvalHook` for the evaluator task,
        `BestExporter`, a SIGTERM or a ps's request, the stall save, an export), so the
        checkpointer's contract (`Checkpointer.save`) is relied on in one place. Every
        synchronous worker calls it together (a save runs collectives).

        `durable`: return only once the files are complete and listed (`wait_for_checkpoints`),
        for a caller that reads them, tells another task, or exits next. Without it the save
        may still be in flight (an asynchronous writer); readers see it once it is complete.
        """
        self.checkpointer.save(self.step)
        if durable:
            self.wait_for_checkpoints()

    def final_save(self) -> FinalSave:
        """What the strategy may save when the task must exit now (a stalled cluster): the
        steps finished so far, durably, through `save_checkpoint`."""

        def save() -> int:
            self.refresh_step()
            self.save_checkpoint(durable=True)  # the task exits next
            return self.step

        return FinalSave(self.checkpointer, save)

    def wait_for_checkpoints(self) -> None:
        """Returns once every save asked for is durable (`Checkpointer.wait`): before the done
        marker and at the end of training."""
        self.checkpointer.wait()

    def export_saved_model(self, path: str) -> None:
        """Exports a copy of the model built outside any strategy, so it serves anywhere.

        The copy reads the latest checkpoint rather than `get_weights()`: sharded
        tables re-shard on restore, so the copy need not match the cluster's layout.
        With `use_ema`, the copy takes the optimizer's averages.
        """
        self.save_checkpoint(durable=True)
        export.export_from_checkpoint(
            self.trainer,
            tf.train.latest_checkpoint(self.model_dir),
            path,
            averages=[a for _, a in ema.averages_of(self.trainer)],
        )

    def latest_checkpoint(self) -> str | None:
        """The prefix of model_dir's newest checkpoint, None before the first."""
        return tf.train.latest_checkpoint(self.model_dir)

    def peak_memory(self) -> dict[str, float]:
        """This task's peak memory so far: {'peak_rss_mib': ..., 'peak_gpu0_mib': ...}."""
        return memory.peak_memory_record()

    def next_loop_end(self, hooks: Sequence[Hook]) -> int:
        """The next step where a loop must end: the target, or the nearest stop a hook asks for.

        A loop may end before it, never after: the step loop returns early when
        `Run.stop` says so between its calls (SIGTERM).
        """
        stops = (h.next_stop(self.step) for h in hooks)
        return min([self.target_step, *(s for s in stops if s is not None)])

    def start_profiler(self, first: int, last: int) -> None:
        """Starts TensorFlow's profiler into model_dir/train (a worker's own directory if not chief)."""
        logdir = storage.join(self.model_dir, "train")
        if not self.cluster.is_chief:
            logdir = storage.join(logdir, self.cluster.role.replace(":", "_"))
        tf.profiler.experimental.start(logdir)
        logging.info(
            "profiling steps %d-%d into %s (TensorBoard: Profile)",
            first,
            last,
            storage.join(logdir, "plugins", "profile"),
        )

    def stop_profiler(self) -> None:
        tf.profiler.experimental.stop()
        logging.info("profiling stopped at step %d", self.step)
