"""The cost rules and the op-family table agree: every op with a shape formula has the family that formula
prices, and every family member that needs a formula has one (adding an op = one row in tpusim/trace/ops.py plus,
for contractions, attention and gathers, its formula in tpusim/backend/costs.py)."""

from tpusim.backend import costs
from tpusim.trace.ops import FAMILY_BY_OP, Family, family_of

SHAPED_FAMILIES = {Family.CONTRACTION, Family.ATTENTION, Family.QUANTIZED_CONTRACTION, Family.GATHER_SCATTER}


def test_every_shape_formula_prices_an_op_of_a_shaped_family():
    mxu = (Family.CONTRACTION, Family.ATTENTION, Family.QUANTIZED_CONTRACTION)
    assert {name for name in costs._MXU if family_of(name) not in mxu} == set()
    assert {name for name in costs._SPARSE if family_of(name) != Family.GATHER_SCATTER} == set()


def test_every_op_of_a_shaped_family_has_a_formula():
    assert {name for name, family in FAMILY_BY_OP.items() if family in SHAPED_FAMILIES} - set(costs._SHAPED) == set()


def test_a_cost_carries_its_family_and_the_family_s_unit():
    import torch

    a = torch.ones(4, 8)
    b = torch.ones(8, 2)
    cost = costs.op_cost("aten::mm", [a, b], [a @ b], (a, b))
    assert (cost.family, cost.unit, cost.flops) == (Family.CONTRACTION, "mxu", 2 * 4 * 8 * 2)
    cost = costs.op_cost("aten::copy_", [a], [a], (a, a))
    assert (cost.family, cost.unit, cost.flops) == (Family.DATA_MOVEMENT, "dma", 0.0)
