"""The parameter_server chief waits for one round of closures, not for every scheduled one.

`watchdog.fetch_closures` on a real ClusterCoordinator (in-process servers): it returns a
round's results while the round queued behind it still runs (`coordinator.join()` would wait
for that one too, leaving the workers idle while the chief schedules the next); a round that
makes no progress for `timeout_s` is a ClusterStalledError naming the busy worker; a failed
closure's own error is raised (a failed copy of a finished result is fetched again, the
settled error tells them apart); a round that came back whole resets TF's count of suspected ps
failures.
"""

from __future__ import annotations

import textwrap

from test_tf_compat import PS_COORDINATOR, run_script


def test_a_round_is_fetched_while_the_next_one_runs_and_a_stall_names_the_worker(tmp_path):
    result = run_script(
        tmp_path,
        PS_COORDINATOR
        + textwrap.dedent(
            """
        from tfdist_trainer.errors import ClusterStalledError
        from tfdist_trainer.runtime.strategies.parameter_server import watchdog

        @tf.function
        def quick():
            return tf.constant(1.5), tf.constant(-1, tf.int64)

        @tf.function
        def fail():
            tf.debugging.assert_equal(release.read_value(), 0, message="bad step")
            return release.read_value()

        out = {}
        first, held = coordinator.schedule(quick), coordinator.schedule(hold)
        loss, first_bad = watchdog.fetch_closures(coordinator, [first], timeout_s=60)[0]
        out["first"] = [float(loss), int(first_bad)]
        out["held_still_running"] = release.numpy() == 0 and not coordinator.done()
        start = time.monotonic()
        try:
            watchdog.fetch_closures(coordinator, [held], timeout_s=2, poll_s=0.2,
                                    worker_addresses=["10.0.0.9:2222"])
        except ClusterStalledError as e:
            out["stall"] = str(e)
            out["stall_after_s"] = time.monotonic() - start
        release.assign(1)
        out["held"] = int(watchdog.fetch_closures(coordinator, [held], timeout_s=60)[0][0])
        failing = coordinator.schedule(fail)
        try:
            watchdog.fetch_closures(coordinator, [failing], timeout_s=60)
        except tf.errors.InvalidArgumentError as e:
            out["failure"] = str(e)
        # What tells a settled failure (raised) from a failed copy of a finished result (retried).
        out["settled"] = [type(tf_compat.remote_value_failure(r)).__name__ for r in (held, failing)]
        print(json.dumps(out), flush=True)
        os._exit(0)  # in-process servers cannot be shut down cleanly
    """
        ),
    )
    assert result["first"] == [1.5, -1] and result["held_still_running"] is True, result
    assert result["stall"].startswith("no scheduled step loop finished for 2s; silent: "), result
    assert "worker:0 (10.0.0.9:2222)" in result["stall"], result
    assert "(1 of 1 closures of this round unfinished)" in result["stall"], result
    assert 2 <= result["stall_after_s"] < 10, result
    assert result["held"] > 0 and "bad step" in result["failure"], result
    assert result["settled"] == ["NoneType", "InvalidArgumentError"], result


def test_a_finished_round_forgives_the_ps_errors_a_restarting_worker_caused(tmp_path):
    """TF's coordinator fails a closure at the third error that names a ps RPC, counted since the
    chief started (`TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`, never reset in TF 2.21): over a
    long job, worker restarts alone would end the chief. A round that came back whole resets it.
    The errors are TF's own kind with the ps RPC text TF looks for, fed to TF's own classifier."""
    result = run_script(
        tmp_path,
        PS_COORDINATOR
        + textwrap.dedent(
            """
        from tfdist_trainer.runtime.strategies.parameter_server import watchdog

        def suspect_ps_error():  # as a worker reports a step whose ps call its restart cut short
            return tf.errors.UnavailableError(None, None, "Socket closed\\nAdditional GRPC error "
                "information from remote target /job:ps/replica:0/task:0/device:CPU:0 while "
                "calling /tensorflow.eager.EagerService/RunComponentFunction")

        ignored = coordinator._cluster._record_and_ignore_transient_ps_failure
        out = {"before_a_round": [ignored(suspect_ps_error()) for _ in range(2)]}
        release.assign(1)
        watchdog.fetch_closures(coordinator, [coordinator.schedule(hold)], timeout_s=60)
        out["after_a_round"] = [ignored(suspect_ps_error()) for _ in range(3)]
        print(json.dumps(out), flush=True)
        os._exit(0)  # in-process servers cannot be shut down cleanly
    """
        ),
    )
    # Two ignored, then a round: two more are ignored; the third in a row is a lost ps again.
    assert result == {"before_a_round": [True, True], "after_a_round": [True, True, False]}, result
