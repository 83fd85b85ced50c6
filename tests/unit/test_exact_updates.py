"""Concurrent sparse updates of one table lose nothing: threads released together by a barrier.

Under parameter_server several workers update the same shard at once; here 4
threads apply updates to the same 8,192 rows, each element's gradient exactly 1,
so the result is known in closed form: Adagrad's accumulator is its initial value
plus the number of updates, SGD's table its initial value minus lr times that
number. The same harness without the shard's lock is the evidence that the
updates really overlapped: there, updates go missing.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import tensorflow as tf

from tfdist_trainer import sharding, tf_compat
from tfdist_trainer.sharding import update_lock

ROWS, DIM, THREADS, UPDATES = 8192, 8, 4, 40
LR, INITIAL_ACCUMULATOR = 0.01, 0.1


def apply_concurrently(optimizer, locked: bool) -> keras.Variable:
    """Each of THREADS threads applies UPDATES gradients of 1 to every row; returns the table."""
    table = keras.Variable(np.zeros((ROWS, DIM), np.float32), name="table")
    if locked:
        update_lock.guard(table)
    optimizer.build([table])
    # every row once per update, in an order that is not the rows' own
    rows = tf.constant(np.random.default_rng(0).permutation(ROWS), tf.int64)
    ones = tf.ones((ROWS, DIM))

    @tf.function
    def update():
        optimizer.apply([tf.IndexedSlices(ones, rows, tf.constant([ROWS, DIM], tf.int64))], [table])

    update.get_concrete_function()  # traced before the threads start
    barrier = threading.Barrier(THREADS)

    def work():
        barrier.wait()
        for _ in range(UPDATES):
            update()

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return table


def adagrad() -> sharding.SparseAdagrad:
    return sharding.SparseAdagrad(LR, initial_accumulator_value=INITIAL_ACCUMULATOR)


def accumulator_updates(optimizer, table) -> np.ndarray:
    """How many updates each element of Adagrad's accumulator received."""
    accumulator = tf_compat.adagrad_accumulator(optimizer, table)
    return np.asarray(accumulator) - INITIAL_ACCUMULATOR


def test_sparse_adagrad_applies_every_concurrent_update_of_the_same_rows():
    optimizer = adagrad()
    table = apply_concurrently(optimizer, locked=True)
    n = THREADS * UPDATES
    np.testing.assert_allclose(accumulator_updates(optimizer, table), n, rtol=1e-6)
    # each update saw the accumulator the one before left: the k-th subtracted lr / sqrt(0.1 + k)
    expected = -LR * sum(1 / np.sqrt(INITIAL_ACCUMULATOR + k + 1e-7) for k in range(1, n + 1))
    np.testing.assert_allclose(np.asarray(table), expected, rtol=1e-4)


def test_sgd_applies_every_concurrent_update_of_the_same_rows():
    table = apply_concurrently(sharding.SGD(LR), locked=True)
    np.testing.assert_allclose(np.asarray(table), -LR * THREADS * UPDATES, rtol=1e-5)


def test_without_the_lock_the_same_updates_overlap_and_are_lost():
    """The negative control: at this size the threads' updates do overlap (so the tests above
    test the lock, not a harness where updates happen to run one at a time)."""
    optimizer = adagrad()
    table = apply_concurrently(optimizer, locked=False)
    lost = 1 - accumulator_updates(optimizer, table).mean() / (THREADS * UPDATES)
    assert lost > 0, f"only {lost:.4%} of the updates were lost without the lock"


def test_every_reshardable_optimizer_updates_a_guarded_table_under_its_lock():
    """`reshardable(cls)` takes the lock for any Keras optimizer: Adam's moments (each a read,
    then a write) end as after every update in a row, m = 1 - beta_1^n and v = 1 - beta_2^n
    (the table itself depends on the step count each update read, which threads share)."""
    optimizer = sharding.reshardable(keras.optimizers.Adam)(LR)
    table = apply_concurrently(optimizer, locked=True)
    n = THREADS * UPDATES
    moments = {v.name: np.asarray(v) for v in optimizer.variables if v.shape == table.shape}
    np.testing.assert_allclose(moments["table_momentum"], 1 - 0.9**n, rtol=1e-5)
    np.testing.assert_allclose(moments["table_velocity"], 1 - 0.999**n, rtol=1e-5)
