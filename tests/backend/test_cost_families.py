"""The backend prices ops by the one op table (tpusim/trace/ops.py ``OPS``): a torch op's cost is the shared
rule's over its tensors' metadata, with the family of its row and the family's unit."""

import torch

from tpusim.backend.program_trace import costs
from tpusim.trace import ops
from tpusim.trace.cost_rules import Meta
from tpusim.trace.ops import Family


def test_a_cost_carries_its_family_and_the_family_s_unit():
    a = torch.ones(4, 8)
    b = torch.ones(8, 2)
    cost = costs.op_cost("aten::mm", [a, b], [a @ b], (a, b))
    assert (cost.family, cost.unit, cost.flops) == (Family.CONTRACTION, "mxu", 2 * 4 * 8 * 2)
    cost = costs.op_cost("aten::copy_", [a], [a], (a, a))
    assert (cost.family, cost.unit, cost.flops) == (Family.DATA_MOVEMENT, "dma", 0.0)


def test_a_torch_tensor_becomes_the_metadata_the_rules_read():
    t = torch.ones(3, 5, dtype=torch.bfloat16)
    assert costs.meta(t) == Meta((3, 5), "bfloat16", 2) and costs.meta(t).nbytes == costs.nbytes(t) == 30


def test_the_backend_cost_is_the_shared_rule_over_metadata():
    x = torch.ones(2, 4, 16, 8, dtype=torch.bfloat16)
    ids = torch.zeros(6, dtype=torch.int64)
    table = torch.ones(50, 8)
    for name, ins, outs, args in [
        ("aten::_scaled_dot_product_flash_attention_for_cpu", [x, x, x], [x], (x, x, x, 0.0, True)),
        ("aten::embedding", [table, ids], [torch.ones(6, 8)], (table, ids)),
        ("aten::gelu", [x], [x], (x,)),
    ]:
        as_meta = [costs.meta(t) for t in ins], [costs.meta(t) for t in outs], tuple(map(costs._arg, args))
        assert costs.op_cost(name, ins, outs, args) == ops.op_cost(name, *as_meta)
