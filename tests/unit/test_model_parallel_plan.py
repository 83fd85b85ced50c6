"""model_parallel plans, in process: parsing, checks, auto-balancing and the LM configs.

Training with them (the CLI, gradients, multi_worker_mirrored workers) is in tests/test_model_parallel.py.
"""

from __future__ import annotations

import pytest
from clusterlib import REPO

from tfdist_trainer.plan import model_parallel_plan
from tfdist_trainer.plan.strategies import ModelParallel


def test_plan_forms_parse_to_ordered_rules():
    as_dict = model_parallel_plan.parse_plan(
        {"embed.*": 0, "block_[0-1].*": 0, "head": 1}, num_devices=2
    )
    as_list = model_parallel_plan.parse_plan(
        [("embed.*", 0), ["block_[0-1].*", 0], ("head", 1)], num_devices=2
    )
    assert [(r.pattern, r.index) for r in as_dict] == [(r.pattern, r.index) for r in as_list]
    assert as_dict[1].matches("block_1") and not as_dict[1].matches("block_2")
    assert model_parallel_plan.parse_plan("AUTO", num_devices=3) == "auto"


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"head": 2}, "puts layer pattern 'head' on device 2, but model_parallel.num_devices=2"),
        ({"head": -1}, "must be an integer >= 0"),
        ({"head(": 0}, "not a valid regular expression"),
        ([("head",)], "(layer regex, device index) pairs"),
        ("balanced", "must be 'auto'"),
        ({}, "is empty"),
    ],
)
def test_bad_plans_are_one_value_error_before_tensorflow(plan, message):
    with pytest.raises(ValueError) as error:
        ModelParallel(plan=plan, num_devices=2)
    # gin adds a line naming the configurable; the CLI shows the first one.
    assert message in str(error.value).splitlines()[0]


def test_other_knobs_are_checked():
    for kwargs, message in [
        ({"num_devices": 0}, "num_devices"),
        ({"num_micro_batches": 0}, "num_micro_batches"),
        ({"data_parallel": "parameter_server"}, "data_parallel"),
    ]:
        with pytest.raises(ValueError, match=message):
            ModelParallel(**kwargs)


def test_auto_balances_contiguous_stages_by_bytes():
    assert model_parallel_plan.balance_contiguous([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert model_parallel_plan.balance_contiguous([40, 10, 10, 10, 10], 2) == [0, 1, 1, 1, 1]
    assert model_parallel_plan.balance_contiguous([1, 1, 1, 1, 1, 1, 6], 3) == [0, 0, 0, 1, 1, 1, 2]
    # Parameter-free layers go with a neighbour; every device gets a non-empty stage.
    stages = model_parallel_plan.balance_contiguous([5, 0, 5, 0, 5, 0, 5], 4)
    assert stages == sorted(stages) and set(stages) == {0, 1, 2, 3}
    assert model_parallel_plan.balance_contiguous([3, 3], 4) == [0, 1]  # fewer layers than devices
    assert model_parallel_plan.balance_contiguous([], 2) == []


def test_model_parallel_lm_configs_parse():
    from tfdist_trainer.plan import gin_config as config
    from tfdist_trainer.plan.strategies import MultiWorkerMirrored

    for name, devices in [("2_devices", 2), ("4_devices", 4), ("8_devices", 8)]:
        experiment = config.load_experiment([f"{REPO}/configs/model_parallel_lm/{name}.gin"], [])
        strategy = experiment.strategy_config
        assert isinstance(strategy, ModelParallel) and strategy.num_devices == devices
        assert strategy.gpu_memory_growth and strategy.num_micro_batches == 4
        assert experiment.loop.mixed_precision == "mixed_bfloat16"
    experiment = config.load_experiment(
        [
            f"{REPO}/configs/model_parallel_lm/tiny.gin",
            f"{REPO}/configs/strategies/model_parallel.gin",
        ],
        ["model_parallel.data_parallel = 'multi_worker_mirrored'"],
    )
    assert isinstance(experiment.strategy_config.workers, MultiWorkerMirrored)
    assert experiment.strategy_config.launch_layout(num_workers=2, num_ps=0) == {"worker": 2}


class Layer:
    """A stand-in for a placed layer, as `auto_stages` sees one: path, own bytes, sublayers in call order."""

    def __init__(self, path: str, own_bytes: int, children: list[Layer] | None = None):
        self.path = path
        self.own_bytes = own_bytes
        self.children = children or []
        self.total_bytes = own_bytes + sum(c.total_bytes for c in self.children)


def stages_of(top: list[Layer], num_stages: int) -> dict[str, int]:
    items, stages = model_parallel_plan.auto_stages(top, num_stages)
    return {item.node.path + ("(own)" if item.own else ""): s for item, s in zip(items, stages)}


def test_auto_descends_into_a_backbone_that_holds_almost_every_byte():
    """A keras-hub task model: one backbone layer with all the blocks, a tiny head after it."""
    blocks = [Layer(f"backbone/block_{i}", 100) for i in range(4)]
    backbone = Layer("backbone", 0, [Layer("backbone/embed", 100), *blocks])
    stages = stages_of([backbone, Layer("head", 1)], 2)
    # Expanded: the backbone's own item (no bytes) stays in front of its blocks.
    assert stages == {
        "backbone(own)": 0,
        "backbone/embed": 0,
        "backbone/block_0": 0,
        "backbone/block_1": 0,
        "backbone/block_2": 1,
        "backbone/block_3": 1,
        "head": 1,
    }


def test_auto_splits_a_block_only_when_blocks_cannot_balance():
    """2 blocks and an embedding: block boundaries give 62% / 38%, so one block is split."""

    def block(i: int) -> Layer:
        parts = ["attention", "mlp_in", "mlp_out"]
        return Layer(f"m/block_{i}", 0, [Layer(f"m/block_{i}/{p}", 100) for p in parts])

    model = Layer("m", 0, [Layer("m/embed", 200), block(0), block(1)])
    items, stages = model_parallel_plan.auto_stages([model], 2)
    assert model_parallel_plan.stage_bytes(items, stages, 2) == [400, 400]
    assert stages == sorted(stages)  # contiguous in call order
    assert stages_of([model], 2)["m/block_0/mlp_in"] == 0
    assert stages_of([model], 2)["m/block_0/mlp_out"] == 1
    assert "m/block_1/mlp_in" not in stages_of([model], 2)  # the other block stays whole
    # Balanced at block boundaries: not split further.
    even = Layer("m", 0, [block(0), block(1)])
    assert set(stages_of([even], 2)) == {"m(own)", "m/block_0", "m/block_1"}


def test_auto_stops_at_leaf_layers_and_says_how_close_it_got():
    items, stages = model_parallel_plan.auto_stages([Layer("big", 900), Layer("small", 100)], 2)
    totals = model_parallel_plan.stage_bytes(items, stages, 2)
    assert totals == [900, 100] and not model_parallel_plan.is_balanced(totals)
