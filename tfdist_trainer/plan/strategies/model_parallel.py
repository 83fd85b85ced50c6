"""model_parallel: one replica whose layers are placed on several devices, optionally pipelined.

The plan half of the strategy (TF-free): its settings, the plan parsed before TF starts
(`plan/model_parallel_plan.py`) and its topology: one process, or with
data_parallel='multi_worker_mirrored' that strategy's workers, each one replica.
`runtime/strategies/model_parallel.py` builds it and places the model.
"""

from __future__ import annotations

import os
from typing import Any

import gin

from tfdist_trainer import checks
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan import model_parallel_plan
from tfdist_trainer.plan.cluster import CHIEF, ClusterConfig, TaskAddress
from tfdist_trainer.plan.strategies.base import GIN_MODULE, StrategyConfig
from tfdist_trainer.plan.strategies.multi_worker_mirrored import MultiWorkerMirrored


@gin.configurable("model_parallel", module=GIN_MODULE)
class ModelParallel(StrategyConfig):
    """One replica whose layers are placed on several devices, optionally pipelined over micro-batches.

    See tfdist_trainer/runtime/strategies/model_parallel/ (placement.py, step.py) for how a plan places layers and how the
    pipelined step works.

    Args:
      plan: 'auto' (contiguous stages in call order balanced by parameter bytes, splitting nested
        layers such as a backbone's blocks until the stages balance within 10%), or
        {layer regex: device index} / [(layer regex, device index), ...] matched against layer
        paths at any depth ('gpt2_backbone/transformer_layer_1'); a nested layer no pattern names
        runs with its parent, a top-level one with the layer before.
      num_devices: devices the plan uses: the first GPUs when there are GPUs, else this many
        logical CPUs (created before TF starts).
      num_micro_batches: 1 runs the batch whole; M > 1 splits each replica batch into M
        micro-batches (GPipe: every forward, then every backward, gradients summed and applied
        once; stages on different devices overlap across micro-batches).
      data_parallel: None, or 'multi_worker_mirrored': each worker process is one model-parallel
        replica, gradients all-reduced across workers (configure it with multi_worker_mirrored.*).
      require_balance: a plan leaving a device with less than half its fair share of the bytes
        fails the start (exit 2) instead of warning.
      gpu_memory_growth: allocate GPU memory as needed instead of all at start.
      placement_file: JSON of the placement (layers, their variables' devices, bytes per device),
        written by the chief; a relative path is under the task's model_dir (`Trainer.context`);
        None writes none.
    """

    name = "model_parallel"
    supports_jit_compile = (
        False  # XLA compiles for one device; the plan spreads a step over several
    )

    def __init__(
        self,
        plan: Any = "auto",
        num_devices: int = 2,
        num_micro_batches: int = 1,
        data_parallel: str | None = None,
        gpu_memory_growth: bool = False,
        placement_file: str | None = "placement.json",
        require_balance: bool = False,
    ):
        if not checks.is_positive_int(num_devices):
            raise ConfigError(
                f"model_parallel.num_devices must be an integer >= 1, got {num_devices!r}."
            )
        if not checks.is_positive_int(num_micro_batches):
            raise ConfigError(
                f"model_parallel.num_micro_batches must be an integer >= 1, got {num_micro_batches!r}."
            )
        if data_parallel in (None, "none", "None"):
            data_parallel = None
        elif data_parallel != "multi_worker_mirrored":
            raise ConfigError(
                f"model_parallel.data_parallel must be None or 'multi_worker_mirrored', "
                f"got {data_parallel!r}."
            )
        self.plan = model_parallel_plan.parse_plan(plan, num_devices=num_devices)
        self.num_devices = num_devices
        self.num_micro_batches = num_micro_batches
        self.data_parallel = data_parallel
        self.gpu_memory_growth = bool(gpu_memory_growth)
        self.placement_file = placement_file
        self.require_balance = bool(require_balance)
        #: Synchronous data parallelism over workers comes from multi_worker_mirrored (its gin
        #: knobs apply); None: one process.
        self.workers: MultiWorkerMirrored | None = MultiWorkerMirrored() if data_parallel else None
        self.holds_port_while_waiting = bool(self.workers and self.workers.holds_port_while_waiting)

    # -- the cluster: one process, or multi_worker_mirrored's workers -----------------
    def validate(self, cluster: ClusterConfig) -> None:
        if self.workers:
            self.workers.validate(cluster)
        else:
            super().validate(cluster)

    def peers(self, cluster: ClusterConfig) -> list[TaskAddress]:
        return self.workers.peers(cluster) if self.workers else []

    def saves_with_peers(self, cluster: ClusterConfig) -> bool:
        return bool(self.workers) and self.workers.saves_with_peers(cluster)

    def launch_layout(self, *, num_workers: int, num_ps: int) -> dict[str, int]:
        return (
            self.workers.launch_layout(num_workers=num_workers, num_ps=num_ps)
            if self.workers
            else {CHIEF: 1}
        )

    def runs_steps(self, task_type: str) -> bool:
        return self.workers.runs_steps(task_type) if self.workers else super().runs_steps(task_type)

    def restart_group(self, failed_role: str, roles: list[str]) -> list[str]:
        return self.workers.restart_group(failed_role, roles) if self.workers else [failed_role]

    def placement_path(self, model_dir: str | None) -> str | None:
        """Where the chief writes the placement report: `placement_file`, under `model_dir` when relative."""
        if not self.placement_file:
            return None
        if os.path.isabs(self.placement_file) or "://" in self.placement_file:
            return self.placement_file
        if not model_dir:
            return None
        from tfdist_trainer.io import storage

        return storage.join(model_dir, self.placement_file)
