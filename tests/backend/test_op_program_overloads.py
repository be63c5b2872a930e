"""An eager op recorded without its overload ("aten::arange") gets the overload that takes its recorded
arguments for its one-op TPU program (tpusim/backend/program_trace/op_programs.py ``_overload``). Trying the others must
never hand a plain int to a dtype, layout or memory-format parameter: ``arange(0, 128)``'s ``end`` read as
``arange.default``'s ``dtype`` is ScalarType 128, which torch reads out of bounds, and the recording process
died with SIGSEGV (found by a sweep of examples/serve.py --compile, issue 30)."""

from __future__ import annotations

import pytest
import torch

from tpusim.backend.program_trace import op_programs

CASES = [
    ("aten::arange", (0, 128), torch.arange(0, 128), "start"),
    ("aten::arange", (128,), torch.arange(128), "default"),
    ("aten::arange", (0, 128, 2, torch.float32), torch.arange(0, 128, 2, dtype=torch.float32), "start_step"),
    ("aten::empty", ([3, 4], torch.float32), torch.empty(3, 4), "memory_format"),
]


@pytest.mark.parametrize("name, args, result, overload", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_the_overload_taking_the_recorded_arguments_is_found_without_a_crash(name, args, result, overload) -> None:
    key = op_programs.signature(name, [], [result])
    assert op_programs._overload(name, args, key)._overloadname == overload
