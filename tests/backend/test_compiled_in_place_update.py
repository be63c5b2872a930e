"""A torch.compile'd function that updates a buffer in place (a static KV cache's ``index_copy_``): AOT autograd
functionalises it to ``index_put`` and writes the result back with ``buffer.copy_(result)`` after the graph; XLA
updates the donated buffer in place, so the write-back moves nothing (tpusim/backend/program_trace/compiled_program.py
``Program.updated_inputs``).

The truths: CPU's values for the buffer; for the bytes, the closed form of a scatter of one row: the row written,
never the whole buffer copied.
"""

from __future__ import annotations

import torch

import tpusim.backend as tb
from tpusim.trace.records import OpRecord


def write_row(cache: torch.Tensor, position: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(0, position, row)
    return cache.sum(0)


def test_a_compiled_in_place_update_writes_its_row_not_the_whole_buffer() -> None:
    rows, width = 4096, 256
    cache, expected = torch.zeros(rows, width).to("tpu"), torch.zeros(rows, width)
    compiled = torch.compile(write_row)
    compiled(cache, torch.tensor([0], device="tpu"), torch.ones(1, width, device="tpu"))   # compiles
    write_row(expected, torch.tensor([0]), torch.ones(1, width))
    row = torch.full((1, width), 2.0)
    with tb.recording() as rec:
        compiled(cache, torch.tensor([7], device="tpu"), row.to("tpu"))
    write_row(expected, torch.tensor([7]), row)
    torch.testing.assert_close(cache.cpu(), expected)
    ops = [r for r in rec.trace.records if isinstance(r, OpRecord)]
    (scatter,) = [r for r in ops if r.op.startswith("aten::index_put")]
    write_back = [r for r in ops if r.op == "aten::copy_" and r.outputs[0].shape == (rows, width)]
    assert scatter.bytes_written == row.nbytes
    assert len(write_back) == 1 and write_back[0].bytes_read == write_back[0].bytes_written == 0
