"""The everyday knobs' settings (`train.*`), checked before TensorFlow starts: one sentence each."""

from __future__ import annotations

import pytest

from tfdist_trainer import Trainer
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.hooks import Profiler
from tfdist_trainer.plan.experiment import Experiment
from tfdist_trainer.plan.strategies import ParameterServer


class AnyTrainer(Trainer):
    pass


def test_gradient_accumulation_and_a_profile_are_accepted():
    experiment = Experiment(
        trainer_cls=AnyTrainer, train_steps=50, gradient_accumulation_steps=4, profile_steps=(5, 9)
    )
    assert experiment.loop.gradient_accumulation_steps == 4
    (profiler,) = [h for h in experiment.hooks if isinstance(h, Profiler)]
    assert (profiler.first, profiler.last) == (5, 9)
    assert (
        profiler.next_stop(0) == 4 and profiler.next_stop(4) == 9 and profiler.next_stop(9) is None
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            dict(gradient_accumulation_steps=0),
            "train.gradient_accumulation_steps must be a positive",
        ),
        (
            dict(gradient_accumulation_steps=True),
            "train.gradient_accumulation_steps must be a positive",
        ),
        (
            dict(gradient_accumulation_steps=2, strategy=ParameterServer(data_service=True)),
            "cannot read through the tf.data service",
        ),
        (dict(profile_steps=(40, 80)), "train.profile_steps must be (first, last)"),
        (dict(profile_steps=(9, 5)), "train.profile_steps must be (first, last)"),
        (dict(profile_steps=5), "train.profile_steps must be (first, last)"),
        (dict(async_checkpoint="yes"), "train.async_checkpoint must be True, False or None"),
        (dict(async_checkpoint=1), "train.async_checkpoint must be True, False or None"),
    ],
)
def test_bad_knobs_are_one_sentence(settings, message):
    with pytest.raises(ConfigError) as error:
        Experiment(trainer_cls=AnyTrainer, train_steps=50, **settings)
    assert message in str(error.value)
