"""model_parallel at run time: a model's layers placed on several devices, its step pipelined.

The TensorFlow half of `plan/strategies/model_parallel.py`. One replica (the default
strategy), or under data_parallel='multi_worker_mirrored' one replica a worker; the plan's
devices are created before TF starts (`prepare_devices`). This runtime places the user's
model (`prepare_model`, `model_built`: `placement`), reports the placement (`state_built`)
and builds the step, pipelined over micro-batches when asked (`train_step_fn`,
`gradients_fn`: `step`).

The machinery only this strategy uses lives beside it, one job a module:

  placement         which device each layer builds and runs on (`Placement`)
  layer_tree        the model as a tree of layers, each once, in call order
  devices           putting a layer's ops and variables on its device
  placement_report  the placement's console lines, log table and placement.json
  step              the pipelined training step (micro-batches, one update)
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan.strategies.model_parallel import ModelParallel
from tfdist_trainer.plan.strategies.multi_worker_mirrored import MultiWorkerMirrored
from tfdist_trainer.plan.task import TaskContext
from tfdist_trainer.runtime.strategies.base import StrategyRuntime, available_gpus
from tfdist_trainer.runtime.strategies.multi_worker_mirrored import communication_options


def _one_replica_per_worker(workers: MultiWorkerMirrored, kind: str) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy with one replica per worker (its first GPU, or its CPU:0).

    A TFConfigClusterResolver makes one replica per local GPU; a SimpleClusterResolver
    built from it says how many accelerators a worker's replica has.
    """
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    one_replica = tf.distribute.cluster_resolver.SimpleClusterResolver(
        resolver.cluster_spec(),
        task_type=resolver.task_type,
        task_id=resolver.task_id,
        rpc_layer=resolver.rpc_layer or "grpc",
        num_accelerators={"GPU": 1} if kind == "GPU" else {},
    )
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=one_replica, communication_options=communication_options(workers)
    )


class ModelParallelRuntime(StrategyRuntime):
    """model_parallel in one task: the devices its plan places layers on, and the placed model.

    Attributes:
      devices: the plan's devices, index i for plan index i (this worker's, under data_parallel).
      host_device: this task's CPU, where inputs and the step's bookkeeping live.
      placement: the `placement.Placement` of the model `prepare_model` placed (one per runtime);
        `train_step_fn` builds the step of that model.
    """

    config: ModelParallel
    calls_model_once = True

    def __init__(
        self,
        config: ModelParallel,
        strategy: tf.distribute.Strategy,
        *,
        devices: list[str],
        host_device: str,
        context: TaskContext | None = None,
    ):
        super().__init__(config, strategy, context=context)
        self.devices = list(devices)
        self.host_device = host_device
        self.placement: Any = None

    @classmethod
    def prepare_devices(cls, config: ModelParallel) -> None:
        """GPU memory growth and a check that the plan's GPUs are there, or as many logical CPUs
        as the plan has devices."""
        gpus = available_gpus()
        if gpus:
            if config.gpu_memory_growth:
                for gpu in gpus:
                    tf.config.experimental.set_memory_growth(gpu, True)
            if len(gpus) < config.num_devices:
                raise ConfigError(
                    f"model_parallel.num_devices={config.num_devices} but only {len(gpus)} GPU(s) are "
                    f"visible; lower num_devices or make more GPUs visible."
                )
            return
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * config.num_devices
        )

    @classmethod
    def start(
        cls, config: ModelParallel, *, context: TaskContext | None = None
    ) -> ModelParallelRuntime:
        """The plan's devices: this process's first ones, or under data_parallel this worker's
        (one model-parallel replica a worker, all-reduced by multi_worker_mirrored)."""
        kind = "GPU" if available_gpus() else "CPU"
        if config.workers:
            strategy = _one_replica_per_worker(config.workers, kind)
            base = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
            devices = [
                base.replace(device_type=kind, device_index=i).to_string()
                for i in range(config.num_devices)
            ]
            host_device = base.replace(device_type="CPU", device_index=0).to_string()
        else:
            strategy = tf.distribute.get_strategy()
            local = tf.config.list_logical_devices(kind)
            if len(local) < config.num_devices:
                raise ConfigError(
                    f"model_parallel.num_devices={config.num_devices} but this process has only "
                    f"{len(local)} {kind} device(s); lower num_devices."
                )
            devices = [d.name for d in local[: config.num_devices]]
            host_device = tf.config.list_logical_devices("CPU")[0].name
        return cls(config, strategy, devices=devices, host_device=host_device, context=context)

    def _log(self, line: str) -> None:
        if self.is_chief:
            logging.info("%s", line)
        else:
            logging.vlog(1, "%s", line)

    def prepare_model(self, model: Any) -> Any:
        from tfdist_trainer.runtime.strategies.model_parallel import placement as placement_lib

        self.placement = placement_lib.Placement(
            model,
            self.config.plan,
            self.devices,
            host_device=self.host_device,
            require_balance=self.config.require_balance,
            log=self._log,
        )
        return self.placement.apply()

    def model_built(self, model: Any) -> None:
        self.placement.finalize()

    def state_built(self, trainer: Any) -> None:
        """Checks every variable (and optimizer slot) is where the plan put it; writes placement.json."""
        from tfdist_trainer import variables

        for path, actual, wanted in self.placement.misplaced():
            logging.warning(
                "model_parallel: variable %s is on %s, not on its planned device %s",
                path,
                actual,
                wanted,
            )
        path = self.config.placement_path(self.context.model_dir if self.context else None)
        if path and self.is_chief:
            variables.write_report(
                path,
                self.placement.report(
                    optimizer=trainer.optimizer,
                    extra={
                        "num_micro_batches": self.config.num_micro_batches,
                        "data_parallel": self.config.data_parallel,
                    },
                ),
            )
            self._log(f"model_parallel placement written to {path}")

    def gradients_fn(self, trainer: Any) -> Any:
        from tfdist_trainer.runtime.strategies.model_parallel import step as step_lib

        step_lib.warn_pipelined_batch_norm(trainer, self.config.num_micro_batches)
        return step_lib.make_gradients_fn(
            trainer,
            num_micro_batches=self.config.num_micro_batches,
            loss_device=self._placed(trainer).loss_device(),
        )

    def _placed(self, trainer: Any) -> Any:
        """The placement of `trainer.model`; one sentence when the state was built without it."""
        if self.placement is None or self.placement.model is not trainer.model:
            raise ConfigError(
                "model_parallel's step needs the model its runtime placed: build the trainer's state "
                "with state.build_state(..., runtime=runtime) before asking for the step."
            )
        return self.placement

    def train_step_fn(self, trainer: Any) -> Any:
        from tfdist_trainer.runtime.strategies.model_parallel import step as step_lib

        placement = self._placed(trainer)
        if self.config.num_micro_batches > 1:
            self._log(
                f"model_parallel pipelines each replica batch over "
                f"{self.config.num_micro_batches} micro-batches"
            )
        return step_lib.make_train_step(
            trainer,
            num_micro_batches=self.config.num_micro_batches,
            loss_device=placement.loss_device(),
            log=self._log,
        )
