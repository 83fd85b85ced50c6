"""The parameter_server chief waits for one round of closures, not for every scheduled one.

`watchdog.fetch_closures` on a real ClusterCoordinator (in-process servers): it returns a
round's results while the round queued behind it still runs (`coordinator.join()` would wait
for that one too, leaving the workers idle while the chief schedules the next); a round that
makes no progress for `timeout_s` is a ClusterStalledError naming the busy worker; a failed
closure's own error is raised.
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
