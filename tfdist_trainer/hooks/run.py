"""What a hook sees of the training run: the `Run` protocol, and each loop's `LoopResult`.

Why here and not beside the runtime's `RunContext`: hooks are TF-free (gin must know
them before a task starts TensorFlow) and sit below the runtime in the import layers;
typing them with the runtime's class made an import cycle that only `TYPE_CHECKING`
hid. The runtime's `RunContext` satisfies `Run`; what a hook may ask of a run is
listed here, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass
class LoopResult:
    """What one `train(steps)` call reports."""

    steps: int
    loss: float  # mean over the steps (NaN if any step was)
    first_nonfinite_step: int | None  # the global step whose loss first was NaN/Inf
    retried: bool = False  # set by NanGuard when it rolled back to a checkpoint
    data_ended: bool = False  # a finite dataset ran out (parameter_server.data_service)


class Run(Protocol):
    """Everything a hook may touch during one training run of one task (`RunContext`)."""

    # The run's objects (TensorFlow's and the plan's: typed loosely, hooks import neither).
    experiment: Any  # the job's `plan.Experiment`
    cluster: Any  # this task's `plan.ClusterConfig`
    trainer: Any  # the user's Trainer
    checkpointer: Any  # `runtime.checkpoints.Checkpointer`: latest_step(), restore()
    record: Any  # metrics.jsonl (`io.records.MetricsRecord`)
    summaries: Any  # TensorBoard (`runtime.logs.Summaries`)
    model_dir: str
    tags: dict[str, str]

    # Where the run is.
    step: int
    target_step: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    last_eval_step: int | None
    evaluations: list[tuple[int, dict[str, float]]]
    has_evaluator_task: bool

    def refresh_step(self) -> None: ...
    def agree(self, flag: bool) -> bool: ...
    def log_info(self, fmt: str, *args: Any) -> None: ...
    def take_train_metrics(self) -> dict[str, float]: ...
    def table_counters(self) -> dict[str, float]: ...
    def learning_rate(self) -> float | None: ...
    def evaluate(self) -> dict[str, float]: ...
    def take_evaluator_results(self) -> None: ...
    def save_checkpoint(self, *, durable: bool = False) -> None: ...
    def wait_for_checkpoints(self) -> None: ...
    def export_saved_model(self, path: str) -> None: ...
    def latest_checkpoint(self) -> str | None: ...
    def peak_memory(self) -> dict[str, float]: ...
    def start_profiler(self, first: int, last: int) -> None: ...
    def stop_profiler(self) -> None: ...
