"""The evaluator side-car: evaluates the checkpoints training writes into model_dir, until it is over.

What Estimator's evaluator task did in ``train_and_evaluate``, with the
same division of work: while a cluster has an evaluator, the training tasks
do not evaluate; the chief saves a checkpoint at every
``train.eval_every_n_steps`` boundary (besides its usual ones) and the
evaluator evaluates each checkpoint once:

* When evaluating takes longer than the chief takes between checkpoints,
  the evaluator evaluates the newest one and says in one line which it
  skipped; it never queues up stale work.
* It pins the checkpoint it is reading (`checkpoints.pin`), so
  ``train.keep_checkpoints`` never deletes it under the evaluator's feet.
* It polls model_dir's ``checkpoint`` file through tf.io.gfile itself, and
  says that it waits once (again only after a long silence, with how
  long), where TF's ``checkpoints_iterator`` logs a line every second.
* Each evaluation is logged, recorded in ``eval/metrics.jsonl`` (the
  evaluator's own journal, ``"evaluated_by": "evaluator"``), summarized
  for TensorBoard under ``eval/`` and handed to every hook's
  `after_side_car_eval` (BestExporter exports there).
* metrics.jsonl has one writer at a time: the chief copies the journal's
  records into it while it trains; once it has marked training done, the
  evaluator adds the rest itself.
* It exits after evaluating the checkpoint of the step the chief marked
  done, so the final checkpoint is always evaluated.
* SIGTERM (a preemption) ends it after the current evaluation, with one
  line and exit code 143 (preempted): training goes on without it, and
  metrics.jsonl stays the chief's. A restart policy brings it back and it
  goes on after the last step it evaluated; without one, the launcher's
  summary says the evaluation is incomplete.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import ConfigError, EvaluatorTimeout, Preempted
from tfdist_trainer.hooks import SideCarEvaluation
from tfdist_trainer.io import markers, storage
from tfdist_trainer.io.records import EVALUATOR_JOURNAL, MetricsRecord
from tfdist_trainer.plan.cluster import EVALUATOR
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime import checkpoints, ema, export, loops, preemption
from tfdist_trainer.runtime.logs import (
    Summaries,
    report_eval,
    trainer_tags,
)
from tfdist_trainer.runtime.state import build_state

#: The value of "evaluated_by" in the evaluator's records (the chief's inline ones say "chief").
EVALUATED_BY = EVALUATOR
#: How often model_dir's checkpoint list is read while waiting (one small read each time).
POLL_S = 1.0
#: A wait is logged when it starts, then once per this much silence.
QUIET_S = 600.0
#: How long a done marker that was already there when the evaluator started may be an older run's,
#: about to be removed by a chief (re)starting on the same model_dir (it waits for its peers first).
STALE_MARKER_GRACE_S = 120.0
#: At most this many skipped steps are named in the log line (all are counted).
_NAMED_SKIPS = 10


class QuietWait:
    """Says that a task is waiting once, then only after each `repeat_s` of silence, with how long.

    `waiting` is called on every poll and `active` whenever something
    happened; `silence_s` is how long the current wait has lasted. The clock
    is this process's own (durations only: nothing is compared across hosts).
    """

    def __init__(
        self,
        log: Callable[..., None] = logging.info,
        *,
        repeat_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._log, self._repeat_s, self._clock = log, repeat_s, clock
        self._since: float | None = None
        self._said: float | None = None

    def waiting(self, what: str) -> None:
        now = self._clock()
        if self._since is None:
            self._since = now
        if self._said is None:
            self._log("waiting for %s", what)
            self._said = now
        elif now - max(self._said, self._since) >= self._repeat_s:
            self._log("still waiting for %s: nothing new for %.0fs", what, now - self._since)
            self._said = now

    def active(self) -> None:
        self._since = None

    def silence_s(self) -> float:
        return 0.0 if self._since is None else self._clock() - self._since


def run_evaluator(
    experiment: Experiment,
    model_dir: str,
    *,
    timeout_s: float,
    context: TaskContext | None = None,
    poll_s: float = POLL_S,
) -> dict[str, float]:
    """Evaluates the checkpoints in model_dir until the chief marks training done; returns the last values.

    `context` is the evaluator task's (`Trainer.context`); None makes one from
    model_dir alone. Raises EvaluatorTimeout after `timeout_s` without a new
    checkpoint. A restarted evaluator goes on after the last step its journal
    holds, so no checkpoint is evaluated twice. The loop has the training
    controller's shape: build, then one action per turn until done.
    """
    side_car = SideCar(experiment, model_dir, context)
    try:
        while True:
            side_car.stop_if_preempted()
            latest = side_car.newer_checkpoint()
            if latest is not None:
                side_car.evaluate(latest)
            elif side_car.training_done():
                side_car.finish()
                break
            else:
                side_car.wait(timeout_s, poll_s)
    finally:
        checkpoints.unpin(model_dir)
    return side_car.values


class SideCar:
    """The evaluator task, built: the model (no optimizer), the eval pass, its journal, where it is."""

    def __init__(self, experiment: Experiment, model_dir: str, context: TaskContext | None):
        self.experiment, self.model_dir = experiment, model_dir
        trainer = self.trainer = experiment.trainer_cls()
        trainer.context = context or TaskContext(
            model_dir=model_dir,
            task_type=EVALUATOR,
            is_chief=False,
            strategy=experiment.strategy_config.name,
        )
        self.global_step, _ = build_state(
            trainer, tf.distribute.get_strategy(), with_optimizer=False
        )
        self.checkpoint = ema.checkpoint_for_reading(trainer, self.global_step)
        self.eval_loop = loops.EvalLoop(trainer, None, distributed=False)
        if not self.eval_loop.enabled:
            raise ConfigError(
                f"{type(trainer).__name__}.build_eval_dataset returned None; the evaluator has nothing to do."
            )
        self.journal = MetricsRecord(storage.join(model_dir, EVALUATOR_JOURNAL))
        self.summaries = Summaries(model_dir, enabled=True)
        self.tags = trainer_tags(trainer)
        self.last_step = max((r["step"] for r in _evaluations(self.journal)), default=None)
        if self.last_step is not None:
            logging.info(
                "going on after step %d, the last %s holds", self.last_step, EVALUATOR_JOURNAL
            )
        self.done = _DoneMarker(model_dir, experiment.loop.train_steps)
        self.quiet_wait = QuietWait()
        self.values: dict[str, float] = {}
        self.termination = preemption.TerminationSignal()  # one line when it stops

    def stop_if_preempted(self) -> None:
        """Raises Preempted (exit 143: a restart goes on) once a SIGTERM came."""
        if not self.termination.received:
            return
        raise Preempted(
            "stopped by SIGTERM "
            + (
                f"after evaluating step {self.last_step}"
                if self.last_step is not None
                else "before any evaluation"
            )
            + "; training goes on without the evaluator: exiting with code 143 (a restart goes "
            "on after that step)"
        )

    def newer_checkpoint(self) -> str | None:
        latest = tf.train.latest_checkpoint(self.model_dir)
        if latest is None or (
            self.last_step is not None and checkpoints.step_of(latest) <= self.last_step
        ):
            return None
        return latest

    def evaluate(self, prefix: str) -> None:
        """Evaluates one checkpoint: logs, journals, summarizes it, and hands it to every hook."""
        if not _read(self.checkpoint, prefix, self.model_dir, by=self.trainer.context.role):
            return  # deleted before it could be read: a newer one exists
        step = int(self.global_step.numpy())
        _say_skipped(self.model_dir, self.experiment, self.last_step, step)
        with ema.averaged_weights(self.trainer):  # the optimizer's averages, if it keeps them
            self._evaluate_and_tell_hooks(prefix, step)
        self.last_step = step
        self.quiet_wait.active()

    def _evaluate_and_tell_hooks(self, prefix: str, step: int) -> None:
        self.values = report_eval(
            self.eval_loop.evaluate(),
            step=step,
            tags=self.tags,
            record=self.journal,
            summaries=self.summaries,
            log=logging.info,
            checkpoint=prefix,
            evaluated_by=EVALUATED_BY,
        )
        evaluation = SideCarEvaluation(
            model_dir=self.model_dir,
            step=step,
            values=self.values,
            checkpoint=prefix,
            export=lambda target: export.export_serving_model(self.trainer.model, target),
        )
        for hook in self.experiment.hooks:  # the same gin config: e.g. BestExporter exports here
            hook.after_side_car_eval(evaluation)

    def training_done(self) -> bool:
        """The chief marked training done at a step this evaluator has evaluated."""
        return self.last_step is not None and self.done.at_or_before(self.last_step)

    def wait(self, timeout_s: float, poll_s: float) -> None:
        self.quiet_wait.waiting(
            f"a checkpoint after step {self.last_step} in {self.model_dir}"
            if self.last_step is not None
            else f"the first checkpoint in {self.model_dir}"
        )
        if self.quiet_wait.silence_s() > timeout_s:
            raise EvaluatorTimeout(
                f"no new checkpoint appeared in {self.model_dir} for {timeout_s:g}s before step "
                f"{self.experiment.loop.train_steps}; is the chief running?"
            )
        preemption.sleep_unless(lambda: self.termination.received, poll_s)

    def finish(self) -> None:
        """metrics.jsonl gets the evaluations the chief did not copy before it finished."""
        added = MetricsRecord(storage.join(self.model_dir, "metrics.jsonl")).add_missing(
            _evaluations(self.journal)
        )
        logging.info(
            "training is done and step %d is evaluated%s: exiting",
            self.last_step,
            f"; added {len(added)} evaluation(s) to metrics.jsonl" if added else "",
        )


def _evaluations(journal: MetricsRecord) -> list[dict]:
    return [r for r in journal.records() if r.get("kind") == "eval"]


def _read(checkpoint: tf.train.Checkpoint, prefix: str, model_dir: str, *, by: str) -> bool:
    """Pins `prefix`, then restores it; False when the chief deleted it before it could be read,
    or its files are damaged (`checkpoints.unreadable_reason`).

    The restore reads every value into memory (the variables exist), so the
    evaluation and any export work from memory; the pin stays until the next
    checkpoint is taken, so the evaluated checkpoint outlives its evaluation.
    """
    checkpoints.pin(model_dir, prefix, by=by)
    try:
        checkpoint.restore(prefix).expect_partial()
    except (IndexError, tf.errors.OpError) as e:
        reason = checkpoints.unreadable_reason(e)
        if reason is None:
            raise
        if storage.exists(f"{prefix}.index"):
            # Damaged: the chief sets it aside at its next start, or saves a newer one. Until
            # then the loop asks for it again at once, so wait a little, and say so at most
            # every 10 minutes.
            logging.log_every_n_seconds(
                logging.WARNING,
                "cannot read %s (%s); skipping it until a newer checkpoint appears",
                600,
                prefix,
                reason,
            )
            time.sleep(5.0)
            return False
        logging.info(
            "%s was deleted (train.keep_checkpoints) before it could be read; taking the newest",
            prefix,
        )
        return False
    if not storage.exists(f"{prefix}.index"):  # read, but deleted by a sweep that missed the pin
        logging.info(
            "%s was deleted (train.keep_checkpoints) as it was read; taking the newest", prefix
        )
        return False
    return True


def _say_skipped(model_dir: str, experiment: Experiment, last_step: int | None, step: int) -> None:
    """One line naming the checkpoints saved after `last_step` and before `step`, which are skipped.

    They are those still listed in model_dir's ``checkpoint`` file, and, once
    this evaluator has evaluated one, every step where the configuration saves
    one (train.checkpoint_every_n_steps, train.eval_every_n_steps): with a
    small train.keep_checkpoints the list has dropped them already.
    """
    state = tf.train.get_checkpoint_state(model_dir)
    listed = {checkpoints.step_of(p) for p in (state.all_model_checkpoint_paths if state else [])}
    planned: set[int] = set()
    if last_step is not None:
        for every in (experiment.checkpoints.every_n_steps, experiment.evaluation.every_n_steps):
            if every:
                planned.update(range((last_step // every + 1) * every, step, every))
    after = last_step if last_step is not None else -1
    skipped = sorted(s for s in listed | planned if after < s < step)
    if not skipped:
        return
    named = ", ".join(str(s) for s in skipped[:_NAMED_SKIPS]) + (
        ", ..." if len(skipped) > _NAMED_SKIPS else ""
    )
    since = f"after step {last_step}" if last_step is not None else "before this evaluator started"
    logging.info(
        "skipping %d checkpoint(s) saved %s (steps %s) to evaluate the newest, step %d: "
        "evaluation takes longer than the interval between checkpoints",
        len(skipped),
        since,
        named,
        step,
    )


class _DoneMarker:
    """The chief's done marker, as the evaluator may trust it.

    A marker written after the evaluator started ends the evaluation. One that
    was already there may be an older run's, which a chief (re)starting on
    the same model_dir removes once it is up: it is trusted when it is at
    ``train.train_steps`` (that run finished this configuration), or once it
    has outlived STALE_MARKER_GRACE_S of this process's time.
    """

    def __init__(self, model_dir: str, train_steps: int):
        self._model_dir, self._train_steps = model_dir, train_steps
        marker = markers.read_marker(model_dir)
        self._stale = marker["run_id"] if marker else None
        self._started = time.monotonic()

    def at_or_before(self, step: int) -> bool:
        """Whether training is done at a step no later than `step` (so `step` was its last checkpoint)."""
        marker = markers.read_marker(self._model_dir)
        if marker is None or marker["step"] > step:
            return False
        return (
            marker["run_id"] != self._stale
            or marker["step"] >= self._train_steps
            or time.monotonic() - self._started >= STALE_MARKER_GRACE_S
        )
