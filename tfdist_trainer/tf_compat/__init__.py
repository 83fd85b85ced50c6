"""The one package allowed to touch private TensorFlow and Keras APIs (checked on TF 2.21 / Keras 3.15).

Each use is one small function whose docstring says what it relies on and why
there is no public way. tests/test_tf_compat.py exercises every one of them
against the installed TensorFlow and Keras, so an upgrade that removes or
changes one fails there, by name, instead of deep inside a training run.

One module per area (checkpoints, a background save's copies, Keras variables, Keras optimizers and metrics,
tf.distribute, compiled Keras models, XLA); every name is re-exported here, so callers write
`tf_compat.<name>` whatever module holds it.

TensorFlow and Keras are imported inside the functions: importing this package
starts nothing (model-parallel plans are checked before TF starts).
"""

from tfdist_trainer.tf_compat.checkpoint_copies import (
    checkpoint_key,
    identity_dict,
    object_names,
    recorded_not_written,
    save_stand_ins,
    saved_dtype_and_device,
    saved_full_name,
    saved_tensors,
    saved_value,
    tensors_trackable,
)
from tfdist_trainer.tf_compat.checkpoints import (
    ReplacesCheckpointChildren,
    checkpoint_variable_names,
    export_archive_of,
    saveable_classes,
    sliced_tensor_trackable,
    track_sublayers,
    trackable_base,
)
from tfdist_trainer.tf_compat.compiled_models import (
    build_compiled_loss,
    compiled_loss,
    compiled_metrics,
)
from tfdist_trainer.tf_compat.distribution import (
    COORDINATOR_BUSY_FRAME,
    COORDINATOR_WORKER_THREAD_PREFIX,
    busy_worker_indices,
    cluster_resolver,
    coordination_service_config,
    forgive_transient_ps_failures,
    graph_functions,
    remote_value_failure,
    wait_at_barrier,
)
from tfdist_trainer.tf_compat.keras_optimizers import (
    OPTIMIZER_SCALAR_CHILDREN,
    adagrad_accumulator,
    make_accumulations_atomic,
    make_metric_updates_atomic,
    make_optimizer_steps_atomic,
    optimizer_model_variables,
    optimizer_scalar_children,
    optimizer_variable,
    read_learning_rate_once,
    replace_gradient_all_reduce,
)
from tfdist_trainer.tf_compat.keras_variables import (
    distributed_components,
    in_stateless_scope,
    in_symbolic_scope,
    local_component,
    moving_averages,
    recreate_variable_storage,
    sparse_read,
    stored_dtype,
    sublayers,
    variable_storage,
    wrap_deferred_initializer,
)
from tfdist_trainer.tf_compat.xla import in_xla_compile

__all__ = [
    "COORDINATOR_BUSY_FRAME",
    "COORDINATOR_WORKER_THREAD_PREFIX",
    "OPTIMIZER_SCALAR_CHILDREN",
    "ReplacesCheckpointChildren",
    "adagrad_accumulator",
    "build_compiled_loss",
    "busy_worker_indices",
    "checkpoint_key",
    "checkpoint_variable_names",
    "cluster_resolver",
    "compiled_loss",
    "compiled_metrics",
    "coordination_service_config",
    "distributed_components",
    "export_archive_of",
    "forgive_transient_ps_failures",
    "graph_functions",
    "identity_dict",
    "in_stateless_scope",
    "in_symbolic_scope",
    "in_xla_compile",
    "local_component",
    "make_accumulations_atomic",
    "make_metric_updates_atomic",
    "make_optimizer_steps_atomic",
    "moving_averages",
    "object_names",
    "optimizer_model_variables",
    "optimizer_scalar_children",
    "optimizer_variable",
    "recorded_not_written",
    "recreate_variable_storage",
    "remote_value_failure",
    "read_learning_rate_once",
    "replace_gradient_all_reduce",
    "save_stand_ins",
    "saveable_classes",
    "saved_dtype_and_device",
    "saved_full_name",
    "saved_tensors",
    "saved_value",
    "sliced_tensor_trackable",
    "sparse_read",
    "stored_dtype",
    "sublayers",
    "tensors_trackable",
    "track_sublayers",
    "trackable_base",
    "variable_storage",
    "wait_at_barrier",
    "wrap_deferred_initializer",
]
