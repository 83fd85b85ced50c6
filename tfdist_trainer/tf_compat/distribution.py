"""Private tf.distribute APIs: a strategy's cluster resolver, a graph's functions, the coordinator's
workers, the coordination service's barrier.

The parameter_server watchdog needs to know which worker holds a closure; a job's orderly
end waits at the coordination service's barrier. TF 2.21 makes none of them public.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

#: Name prefix of ClusterCoordinator's per-worker threads ("WorkerClosureProcessingLoop-<worker index>").
COORDINATOR_WORKER_THREAD_PREFIX = "WorkerClosureProcessingLoop-"
#: The `Worker` method a coordinator thread is inside while it runs a closure on its worker.
COORDINATOR_BUSY_FRAME = "_process_closure"


def cluster_resolver(strategy: Any) -> Any:
    """The strategy's cluster resolver: its public `cluster_resolver`, else `strategy._cluster_resolver`; or None.

    TF 2.21's public `Strategy.cluster_resolver` reads
    `strategy.extended._cluster_resolver`, which a ParameterServerStrategy's
    extended object never sets (it keeps the resolver on the strategy
    itself), so for that strategy the public property is None.
    """
    return getattr(strategy, "cluster_resolver", None) or getattr(
        strategy, "_cluster_resolver", None
    )


def graph_functions(graph: Any) -> list:
    """The function graphs defined in a `tf.Graph` (`Graph._functions`: loop bodies, branches, calls).

    A traced step's `tf.while_loop` body lives in such a function; the
    public `graph.as_graph_def().library` holds their FunctionDefs, not graphs
    whose ops can be inspected.
    """
    return [
        f.graph
        for f in getattr(graph, "_functions", {}).values()
        if getattr(f, "graph", None) is not None
    ]


def busy_worker_indices() -> list[int]:
    """Indices of the workers whose ClusterCoordinator thread is running a closure right now.

    ClusterCoordinator keeps one thread per worker, named
    "WorkerClosureProcessingLoop-<index>", that sits in `Worker._process_closure`
    while its worker runs a closure. TF has no public view of which worker holds
    which closure, so this reads the thread names and their Python stacks.
    """
    frames = sys._current_frames()  # noqa: SLF001
    busy = []
    for thread in threading.enumerate():
        if not thread.name.startswith(COORDINATOR_WORKER_THREAD_PREFIX):
            continue
        frame = frames.get(thread.ident)
        while frame is not None:
            if frame.f_code.co_name == COORDINATOR_BUSY_FRAME:
                busy.append(int(thread.name[len(COORDINATOR_WORKER_THREAD_PREFIX) :]))
                break
            frame = frame.f_back
    return sorted(busy)


def remote_value_failure(remote_value: Any) -> BaseException | None:
    """The error ClusterCoordinator settled a finished closure with (`RemoteValueImpl._error`), or None.

    `RemoteValue.fetch()` raises two kinds of error alike: the closure's own
    failure, which TF has settled, and a failed copy of a finished closure's
    result from a worker that died meanwhile. TF's worker thread makes that
    same copy, sees the worker's death and runs the closure again elsewhere;
    a fetch that raced it must wait for the new result, not give up. Only
    the settled error tells them apart, and TF has no public accessor for it.
    """
    return getattr(remote_value, "_error", None)


def forgive_transient_ps_failures(coordinator: Any) -> None:
    """Starts ClusterCoordinator's count of suspected ps failures again from zero.

    The coordinator ignores an error that names a ps RPC (a restarting worker's
    in-flight step, a cluster update cancelling remote calls) as transient until
    it has seen `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES` (3) of them for
    that ps, and then fails the closure. The count is never reset in TF 2.21
    (`Cluster._potential_ps_failures_count`), so in a long job the third such
    error *ever* ends the chief, however many rounds every ps answered in
    between. Called after each round that finished, the threshold means three
    in a row, which is what it is for: a dead ps still fails the first round
    after its death (its errors come in a burst).
    """
    cluster = coordinator._cluster  # noqa: SLF001
    with cluster._potential_ps_failures_lock:  # noqa: SLF001
        counts = cluster._potential_ps_failures_count  # noqa: SLF001
        counts[:] = [0] * len(counts)


def coordination_service_config() -> Any | None:
    """This process's coordination service settings (leader, coordinated jobs), or None.

    Private: no public API says which task leads the coordination service that
    multi_worker_mirrored sets up, and the orderly shutdown must know it.
    """
    from tensorflow.python.eager import context

    return context.context().coordination_service


def wait_at_barrier(barrier_id: str, timeout_s: float) -> None:
    """Blocks until every coordinated task reached `barrier_id`; raises a tf.errors.OpError on
    failure (a peer died, the timeout passed, or no coordination service runs here)."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier_id, int(timeout_s * 1000))
