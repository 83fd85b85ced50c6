"""A gin binding of the user's Trainer is checked against every ``__init__`` its ``**kwargs`` reach.

In process, before any task: a misspelt parameter of a Trainer whose ``__init__`` forwards
``**kwargs`` (gin accepts any name for it) is one ConfigError sentence naming the binding, the
class, a close match and what the chain accepts; a base class's parameter bound through the
subclass's name is accepted. Every gin file under configs/ still loads, and the recipes' Trainers
take explicit arguments. Through the real commands: tests/test_bad_inputs.py.
"""

from __future__ import annotations

import pathlib

import gin
import pytest
from clusterlib import REPO

import tfdist_trainer
from tfdist_trainer import Trainer
from tfdist_trainer.errors import ConfigError
from tfdist_trainer.plan import gin_config
from tfdist_trainer.plan.trainer_bindings import accepted_parameters, init_chain


@gin.configurable("BindingsMiddleTrainer")
class MiddleTrainer(Trainer):
    """A user's base Trainer: its own parameter, the rest forwarded to Trainer."""

    def __init__(self, *, hidden: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden


@gin.configurable("BindingsLeafTrainer")
class LeafTrainer(MiddleTrainer):
    """A **kwargs subclass of a **kwargs subclass, as a user who copied a recipe writes it."""

    def __init__(self, *, embedding_dim: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = embedding_dim


class UnregisteredLeaf(LeafTrainer):
    """No __init__ and no gin registration of its own: the chain is its parents'."""


def _load(*bindings: str, trainer: str = "@BindingsLeafTrainer"):
    return gin_config.load_experiment([], [f"train.trainer_cls = {trainer}", *bindings])


def _refused(*bindings: str, trainer: str = "@BindingsLeafTrainer") -> str:
    with pytest.raises(ConfigError) as raised:
        _load(*bindings, trainer=trainer)
    message = str(raised.value)
    assert "\n" not in message and message.endswith("."), message
    return message


def test_the_walk_follows_kwargs_up_to_the_first_init_without_them():
    chain = init_chain(LeafTrainer)
    assert [link.owner for link in chain] == [LeafTrainer, MiddleTrainer, Trainer]
    assert [link.forwards_kwargs for link in chain] == [True, True, False]
    assert accepted_parameters(LeafTrainer) == (
        "embedding_dim",
        "hidden",
        "global_batch_size",
        "eval_batch_size",
    )
    assert accepted_parameters(UnregisteredLeaf) == accepted_parameters(LeafTrainer)
    assert accepted_parameters(Trainer) == ("global_batch_size", "eval_batch_size")


def test_a_typo_is_one_sentence_with_a_close_match():
    message = _refused("BindingsLeafTrainer.embeding_dim = 8")
    assert message.startswith(
        "gin binding BindingsLeafTrainer.embeding_dim names no parameter of LeafTrainer "
        "(did you mean BindingsLeafTrainer.embedding_dim?); it accepts embedding_dim, and "
        "through **kwargs MiddleTrainer's hidden and Trainer's global_batch_size, eval_batch_size."
    ), message


def test_a_name_far_from_any_gets_no_suggestion():
    message = _refused("BindingsLeafTrainer.colour = 'red'")
    assert "BindingsLeafTrainer.colour" in message and "did you mean" not in message, message


def test_a_scoped_binding_is_named_with_its_scope():
    message = _refused("eval/BindingsLeafTrainer.hiden = 3")
    assert "gin binding eval/BindingsLeafTrainer.hiden" in message, message
    assert "did you mean eval/BindingsLeafTrainer.hidden?" in message, message


def test_a_gin_configurable_base_is_checked_against_its_own_chain():
    message = _refused("BindingsMiddleTrainer.embedding_dim = 8")
    assert "names no parameter of MiddleTrainer" in message, message
    assert "it accepts hidden, and through **kwargs Trainer's" in message, message


def test_a_base_class_parameter_bound_through_the_subclass_is_accepted():
    experiment = _load(
        "BindingsLeafTrainer.global_batch_size = 32",
        "BindingsLeafTrainer.hidden = 8",
        "BindingsLeafTrainer.embedding_dim = 2",
        "Trainer.eval_batch_size = 5",
    )
    trainer = experiment.trainer_cls()
    assert (trainer.global_batch_size, trainer.eval_batch_size) == (32, 5)
    assert (trainer.hidden, trainer.embedding_dim) == (8, 2)


def test_gins_own_errors_stay_as_they_are():
    with pytest.raises(ConfigError, match="No configurable matching 'NoSuchTrainer'"):
        _load("NoSuchTrainer.hidden = 3")
    with pytest.raises(ConfigError, match="doesn't have a parameter named 'global_batch'"):
        _load("Trainer.global_batch = 3")


def test_the_python_api_raises_it(tmp_path):
    with pytest.raises(ConfigError, match="did you mean BindingsLeafTrainer.embedding_dim"):
        tfdist_trainer.train(
            LeafTrainer,
            gin_bindings=["BindingsLeafTrainer.embeding_dim = 8"],
            model_dir=str(tmp_path / "run"),
        )
    assert not (tmp_path / "run").exists()


CONFIGS = sorted(str(p.relative_to(REPO)) for p in pathlib.Path(REPO, "configs").rglob("*.gin"))


@pytest.mark.parametrize("path", CONFIGS)
def test_every_gin_file_under_configs_loads(path, monkeypatch):
    """A recipe's file builds its Experiment (every Trainer binding checked); a strategy's parses."""
    monkeypatch.chdir(REPO)
    if path.startswith("configs/strategies/"):
        gin_config.parse_gin([path], [])
        return
    # an add-on (mnist_best_export.gin...) names no trainer: it goes after the recipe it adds to
    recipe = [] if "train.trainer_cls" in pathlib.Path(path).read_text() else ["configs/mnist.gin"]
    experiment = gin_config.load_experiment([*recipe, path], [])
    chain = init_chain(experiment.trainer_cls)
    if experiment.trainer_cls.__module__.startswith("recipes."):
        # explicit arguments: a copy of the recipe gets Python's and gin's own name checks
        assert not chain[0].forwards_kwargs, f"{experiment.trainer_cls} takes **kwargs"
    # ...and `Trainer.global_batch_size` still reaches Trainer: the recipe passes on only what
    # it was given (an explicit default would silently win over the binding)
    bound = gin.query_parameter("Trainer.global_batch_size")
    assert experiment.trainer_cls().global_batch_size == bound
