"""steps_per_loop in process: the 'auto' tuner with fake timings, and a loop that never retraces.

The speed knobs end to end are in tests/test_speed_features.py.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfdist_trainer.runtime import loops
from tfdist_trainer.runtime import state as state_lib
from tfdist_trainer.trainers.trainer import Trainer


def _feed(tuner: loops.StepsPerLoopTuner, seconds_per_call, calls: int) -> None:
    for _ in range(calls):
        tuner.observe(tuner.value, seconds_per_call(tuner.value))


def test_tuner_doubles_while_throughput_improves_then_settles_on_the_best():
    # Fixed overhead of 10 ms per call plus 1 ms per step: gains shrink as calls grow.
    tuner = loops.StepsPerLoopTuner(initial=4, maximum=1024, min_gain=0.05, patience=0)
    _feed(tuner, lambda n: 0.010 + 0.001 * n, 60)
    assert tuner.frozen
    # 128 -> 256 gains 3.5% (< 5%), so 128 is the last size that paid off.
    assert tuner.value == 128


def test_tuner_gives_a_small_gain_one_more_doubling():
    # The same costs with the default patience: 256 misses, but 512 is 5.8% faster than 128
    # (981 vs 928 steps/s), and the search ends at the maximum after 1024 misses.
    tuner = loops.StepsPerLoopTuner(initial=4, maximum=1024, min_gain=0.05)
    _feed(tuner, lambda n: 0.010 + 0.001 * n, 60)
    assert tuner.frozen and tuner.value == 512


def test_tuner_settles_on_the_best_size_after_noise():
    # 16 looks slower than 8 (a noisy trial), 32 is really faster: the search goes on past 16.
    times = {8: 1.0, 16: 2.4, 32: 3.0, 64: 6.0, 128: 12.0}
    tuner = loops.StepsPerLoopTuner(initial=8, maximum=128)
    _feed(tuner, lambda n: times[n], 40)
    assert tuner.frozen and tuner.value == 32


def test_tuner_stops_at_maximum():
    tuner = loops.StepsPerLoopTuner(initial=4, maximum=32)
    _feed(tuner, lambda n: 1.0, 40)  # pure per-call overhead: bigger is always better
    assert tuner.frozen and tuner.value == 32


def test_a_search_that_always_sees_a_gain_settles_within_half_the_run():
    # Every doubling looks faster (a loaded host), the worst case for when the search ends.
    for train_steps in (200, 2500, 10_000, 1_000_000):
        maximum = loops.search_maximum(8, train_steps, hook_spacing=None)
        tuner = loops.StepsPerLoopTuner(initial=8, maximum=maximum)
        spent = 0
        while not tuner.frozen:
            n = tuner.value
            tuner.observe(n, 1.0)  # every call 1 s, however long: bigger is always faster
            spent += n
        assert spent <= max(train_steps // 2, 40), (train_steps, maximum, spent)
    assert loops.search_maximum(8, 1_000_000, hook_spacing=None) == 1024
    assert loops.search_maximum(8, 2500, hook_spacing=None) == 256


def test_the_search_goes_no_further_than_the_hook_stops():
    # log_every_n_steps=100: a call never runs more than 100 steps, so 128 would never be timed.
    assert loops.search_maximum(8, 1_000_000, hook_spacing=100) == 64
    assert loops.search_maximum(8, 1_000_000, hook_spacing=5) == 8


def test_tuner_ignores_short_calls_at_boundaries():
    tuner = loops.StepsPerLoopTuner(initial=8)
    for _ in range(20):
        tuner.observe(3, 100.0)  # a 3-step remainder before a checkpoint says nothing
    assert tuner.value == 8 and not tuner.frozen


def test_synchronous_workers_take_the_same_decision():
    # Worker A sees no gain, worker B does: with agree=max both keep doubling.
    decisions = []
    tuner = loops.StepsPerLoopTuner(
        initial=4, agree=lambda v: max(v, 1) if not decisions.append(v) else v
    )
    _feed(tuner, lambda n: 1.0 * n, 6)  # no gain at all locally
    assert tuner.value > 4 and not tuner.frozen


class _TinyTrainer(Trainer):
    def build_model(self):
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    def build_train_dataset(self, input_context):
        x = tf.random.stateless_normal([256, 4], seed=[1, 2])
        y = tf.cast(x[:, 0] > 0, tf.int64)
        return (
            tf.data.Dataset.from_tensor_slices((x, y))
            .repeat()
            .batch(self.per_replica_batch_size(input_context))
        )

    def compute_loss(self, labels, logits):
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def test_loop_traces_once_for_any_number_of_steps():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = _TinyTrainer(global_batch_size=16)
    global_step, _ = state_lib.build_state(trainer, strategy)
    loop = loops.TrainLoop(strategy, trainer, global_step, steps_per_loop=10)
    for steps in (10, 7, 23, 3):
        result = loop.train(steps)
        assert result.steps == steps
    assert int(global_step.numpy()) == 43
    assert loop._loop.experimental_get_tracing_count() == 1
    # A second loop over the same Trainer (a benchmark, a re-built loop) traces cleanly too.
    second = loops.TrainLoop(strategy, trainer, global_step, steps_per_loop=5)
    assert second.train(5).steps == 5


def test_loop_stops_between_calls_when_asked():
    # A SIGTERM is honoured after the call that was running, however many steps were asked:
    # `stop` is asked before every call but the first (the caller has just checked).
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    trainer = _TinyTrainer(global_batch_size=16)
    global_step, _ = state_lib.build_state(trainer, strategy)
    loop = loops.TrainLoop(strategy, trainer, global_step, steps_per_loop=10)
    asked: list[int] = []

    def stop() -> bool:
        asked.append(int(global_step.numpy()))
        return len(asked) == 2

    result = loop.train(1000, stop=stop)
    assert result.steps == 20 and int(global_step.numpy()) == 20 and asked == [10, 20]
    assert loop.train(1000, stop=lambda: True).steps == 10  # one call, whatever it is asked
