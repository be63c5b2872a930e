"""What tpusim/backend/aten/op_schema.py reads from an overload's schema, against the schemas' own text."""

from __future__ import annotations

import torch

from tpusim.backend.aten import op_schema

aten = torch.ops.aten


def test_in_place_out_view_and_functional_overloads() -> None:
    add_ = op_schema.facts(aten.add_.Tensor)            # (Tensor(a!) self, Tensor other, *, Scalar alpha=1)
    assert add_.writes_self_only and not add_.writes_out_only and add_.written_positions == (0,)
    out = op_schema.facts(aten.add.out)                 # (Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out)
    assert out.writes_out_only and not out.writes_self_only and out.written_keywords == ("out",)
    view = op_schema.facts(aten.view.default)           # (Tensor(a) self, SymInt[] size) -> Tensor(a)
    assert view.returns_view and not view.writes
    add = op_schema.facts(aten.add.Tensor)
    assert not add.writes and not add.returns_view
    foreach = op_schema.facts(aten._foreach_add_.List)  # self is a Tensor[] (written), not one Tensor
    assert foreach.writes and not foreach.writes_self_only and not foreach.writes_out_only


def test_functional_counterparts() -> None:
    assert op_schema.functional_of(aten.add_.Tensor) is aten.add.Tensor
    assert op_schema.functional_of(aten.add.out) is aten.add.Tensor
    assert op_schema.functional_of(aten.sum.IntList_out) is aten.sum.dim_IntList


def test_argument_kinds_and_the_generator() -> None:
    normal = op_schema.facts(aten.normal.Tensor_float)  # (Tensor mean, float std=1, *, Generator? generator=None)
    assert normal.positional == ((0, op_schema.TENSOR),) and normal.keyword == (("generator", op_schema.GENERATOR),)
    assert normal.generator_keyword == "generator" and normal.generator_position == -1
    cat = op_schema.facts(aten.cat.default)             # (Tensor[] tensors, int dim=0)
    assert cat.positional == ((0, op_schema.TENSOR_LIST),)
    empty = op_schema.facts(aten.empty.memory_format)   # (SymInt[] size, *, ScalarType? dtype, ..., Device? device)
    assert ("dtype", op_schema.DTYPE) in empty.keyword and ("device", op_schema.DEVICE) in empty.keyword
