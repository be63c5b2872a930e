"""Backward ops point at the user's forward line (issue 45): the autograd node that runs a backward op was made by a
forward op, and that op's line is where to act (an mxu-padding warning at ``loss.backward()`` names no layer). The
truth: the lines of this file that made each layer's node."""

from __future__ import annotations

import inspect

import torch
from torch import nn

import tpusim.backend as tb
from tpusim.trace.records import OpRecord, StepMarker


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


def test_backward_ops_point_at_the_forward_line_that_made_their_node() -> None:
    first, second = nn.Linear(24, 40).to("tpu"), nn.Linear(40, 8).to("tpu")
    x = torch.randn(16, 24, device="tpu")
    here = __file__.rsplit("/", 1)[-1]
    with tb.recording() as rec:
        h = first(x); first_line = _line()                                      # noqa: E702
        r = h.relu(); relu_line = _line()                                       # noqa: E702
        loss = second(r).square().sum(); second_line = _line()                  # noqa: E702
        tb.step()                                                               # a marker: the forward ends here
        loss.backward(); backward_line = _line()                                # noqa: E702
    records = rec.trace.records
    marker = next(i for i, r in enumerate(records) if isinstance(r, StepMarker))
    backward = [r for r in records[marker:] if isinstance(r, OpRecord)]
    assert backward, "the backward pass recorded ops"
    by_op: dict[str, set[str]] = {}
    for op in backward:
        by_op.setdefault(op.op, set()).add(op.source)
    assert by_op["aten::threshold_backward"] == {f"{here}:{relu_line}"}
    matmuls = {op.source for op in backward if op.op == "aten::mm"}               # weight and input grads
    assert matmuls == {f"{here}:{first_line}", f"{here}:{second_line}"}
    at_backward = [op.op for op in backward if op.source == f"{here}:{backward_line}"]
    assert set(at_backward) <= {"aten::fill_", "aten::ones_like", "aten::empty_like", "aten::copy_"}, at_backward
