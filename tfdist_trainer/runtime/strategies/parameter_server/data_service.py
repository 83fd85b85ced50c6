"""parameter_server.data_service: the training data read once per epoch through TF's tf.data service.

Without it each parameter_server worker reads its own static share of the
data: a worker that dies leaves its share unread while it is down and reads
it again from the start when it comes back. With it a dispatcher task hands
out the data in small splits (`ShardingPolicy.DYNAMIC`), a tf.data worker in
each training worker's process reads them, and every example of an epoch is
read at most once, even across worker restarts (exactly once when none
restarts). The dispatcher keeps a journal under model_dir
(`fault_tolerant_mode`): a restarted dispatcher goes on with the epoch.

The tf.data workers run the user's dataset in C++, away from the Python that
built it: a dataset that calls back into Python cannot be served, and
`check_servable` says so in one sentence before anything starts.
"""

from __future__ import annotations

import warnings
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist_trainer.errors import ConfigError
from tfdist_trainer.io import storage
from tfdist_trainer.plan.cluster import DISPATCHER, WORKER, ClusterConfig

#: The dispatcher's journal, relative to model_dir.
JOURNAL_DIR = "data_service"

#: One tf.data service job per run: consumers that come back (a restarted worker, a restarted
#: chief) join the same job and read on where the epoch is.
JOB_NAME = "tfdist-train"

#: How often a tf.data worker tells the dispatcher it is alive, and how long the dispatcher waits
#: before it takes a silent one out of the job (TF's defaults: 30 s and 1 min). Readers wait
#: for a lost tf.data worker's splits until it is taken out.
HEARTBEAT_S = 2.0
WORKER_TIMEOUT_S = 10.0

#: Ops that run Python; the tf.data workers have none to run.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def start_servers(cluster: ClusterConfig, model_dir: str) -> list[Any]:
    """Starts this task's part of the tf.data service (none without a dispatcher); keep the result.

    The dispatcher task runs the dispatcher; each parameter_server worker runs
    a tf.data worker beside its TF server, so the data is read where it is used.
    """
    address = cluster.dispatcher_address
    own = cluster.own_address
    if address is None or own is None:
        return []
    service = tf.data.experimental.service
    if cluster.task_type == DISPATCHER:
        journal = storage.join(model_dir, JOURNAL_DIR)
        dispatcher = service.DispatchServer(
            service.DispatcherConfig(
                port=own.port,
                work_dir=journal,
                fault_tolerant_mode=True,
                worker_timeout_ms=int(WORKER_TIMEOUT_S * 1000),
            )
        )
        logging.info("tf.data dispatcher at %s (journal %s)", dispatcher.target, journal)
        return [dispatcher]
    if cluster.task_type == WORKER:
        # A fixed address: readers wait for a lost tf.data worker's unfinished tasks until a
        # worker registers again at the same address (measured: an epoch never ends without it).
        data_address = cluster.data_worker_address
        worker = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=address,
                worker_address=data_address,
                port=int(data_address.rsplit(":", 1)[1]),
                heartbeat_interval_ms=int(HEARTBEAT_S * 1000),
            )
        )
        logging.info("tf.data worker at %s for the dispatcher at %s", data_address, address)
        return [worker]
    return []


def served(dataset: tf.data.Dataset, dispatcher_address: str) -> tf.data.Dataset:
    """`dataset` read through the service: each element of an epoch goes to one reader.

    TF's `distribute` reads the dataset's options while the per-worker function
    is traced and warns that graph mode may not see them all (a UserWarning on
    every chief start); the options it needs are in the graph it sends, so the
    warning is kept off the console.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
        return dataset.apply(
            tf.data.experimental.service.distribute(
                processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
                service=f"grpc://{dispatcher_address}",
                job_name=JOB_NAME,
            )
        )


def check_servable(made_by: str) -> None:
    """Raises ConfigError when the dataset being traced calls Python (py_function, from_generator...).

    Call it inside the function that builds the served dataset, right after the
    user's code ran: the graph being built then holds the dataset's ops and, in
    its library, those of its map and generator functions. Checking there, not
    on a dataset built eagerly beforehand, leaves the user's pipeline code run
    exactly as often as without the service.
    """
    graph = tf.compat.v1.get_default_graph().as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    if ops & _PYTHON_OPS:
        raise ConfigError(
            f"parameter_server.data_service=True serves the training data from tf.data workers that "
            f"cannot run Python, but the dataset of {made_by} calls Python (tf.py_function, "
            f"tf.numpy_function or Dataset.from_generator); build it from TF ops only, or set "
            f"parameter_server.data_service=False."
        )
