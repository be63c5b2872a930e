"""Builders the tests share: a toy chip with round numbers, tensors, a small training trace.

Why one module: tests used to import each other's helpers (test_compare imported test_report) and
each re-declared its own toy chip and tensor builder. Adding a builder = one function here.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
from pathlib import Path

from tpusim.hardware.spec import ChipSpec, load_chip
from tpusim.trace.records import (
    PHASE_REASON,
    CollectiveRecord,
    HostRecord,
    MemoryRecord,
    OpRecord,
    StepMarker,
    TensorMeta,
    Trace,
    renumber,
)

# A user's script: three SGD steps of one matmul on "tpu" (tpusim check's and the pytest plugin's tests run it)
TRAINING_SCRIPT = """\
import torch
x = torch.randn(64, 128, device="tpu")
w = torch.randn(128, 128, device="tpu", requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    (x @ w).relu().sum().backward()
    opt.step()
    opt.zero_grad()
"""

US = 1e-6
N = 250_000          # float32 elements of a 1 MB tensor
MB = 1e6


def toy_chip(**overrides: object) -> ChipSpec:
    """A v5p with round numbers: HBM 1 TB/s (1 MB = 1 us), launch 1 us, host dispatch 0.5 us, PCIe 1 GB/s
    (1 kB = 1 us), VPU and transcendentals 1e15/s, SparseCore gathers 1 TB/s, 1 GB of HBM; ``overrides``
    replace any field."""
    base = dict(name="toy", hbm_bytes_per_s=1e12, kernel_launch_ns=1000.0, host_dispatch_ns=500.0,
                vpu_flops_per_s=1e15, transcendentals_per_s=1e15, pcie_bytes_per_s=1e9,
                sparsecores_per_chip=4, sparsecore_gather_bytes_per_s=1e12, hbm_bytes=10**9,
                compile_per_op_s=0.0)     # a miss costs compile_s flat unless a test asks for the per-op part
    return dataclasses.replace(load_chip("v5p"), **{**base, **overrides})


ITEM_BYTES = {"bfloat16": 2, "float16": 2, "int8": 1, "float8_e4m3fn": 1}     # any other dtype: 4


def tensor(storage: int, n: int = N, dtype: str = "float32", shape: tuple[int, ...] | None = None) -> TensorMeta:
    """A tensor whose id is its storage id: ``n`` elements (1 MB of float32 by default), or ``shape``."""
    shape = shape or (n,)
    return TensorMeta(storage, shape, dtype, math.prod(shape) * ITEM_BYTES.get(dtype, 4), storage)


A = TensorMeta(1, (64, 128), "bfloat16", 64 * 128 * 2, 1)
B = TensorMeta(2, (128, 64), "bfloat16", 128 * 64 * 2, 2)
C = TensorMeta(3, (64, 64), "bfloat16", 64 * 64 * 2, 3)


SDPA_OVERRIDEABLE = "aten::_scaled_dot_product_fused_attention_overrideable"


def decode_trace(*, layers: int, batch: int, heads: int, head_dim: int, dim: int, context: int, prompt: int,
                 steps: int, marked: bool = True, tp: int = 0, kv_dtype: str = "bfloat16") -> Trace:
    """An inference program: a prefill of ``prompt`` tokens, then ``steps`` decode steps of one token, each phase
    marked (``tpusim.backend.phase``) or not; per layer a projection over its bf16 weight, a write into a static KV
    cache (the same storages every step) and attention over the whole cache; with ``tp`` > 1 ranks (tensor-parallel
    decode, as Megatron's row-parallel projection) the projection's output is all-reduced over ranks 0..tp-1;
    ``kv_dtype`` is the cache's (int8 or fp8 for a quantised KV cache)."""
    def bf16(storage: int, shape: tuple[int, ...]) -> TensorMeta:
        return tensor(storage, dtype="bfloat16", shape=shape)

    weights = [bf16(100 + layer, (dim, dim)) for layer in range(layers)]
    cache = (batch, heads, context, head_dim)
    caches = [tuple(tensor(200 + 2 * layer + i, dtype=kv_dtype, shape=cache) for i in (0, 1))
              for layer in range(layers)]
    held = (*weights, *(c for kv in caches for c in kv))
    records: list = [MemoryRecord(0, "alloc", t.storage, t.nbytes) for t in held]
    records.append(HostRecord(0, "h2d", "copy", bytes=64, source="model.py:5"))
    for fresh, (phase, tokens) in enumerate([("prefill", prompt), *[("decode", 1)] * steps]):
        x, y = bf16(1000 + 4 * fresh, (batch * tokens, dim)), bf16(1001 + 4 * fresh, (batch * tokens, dim))
        q = bf16(1002 + 4 * fresh, (batch, heads, tokens, head_dim))
        out = bf16(1003 + 4 * fresh, (batch, heads, tokens, head_dim))
        if marked:
            records.append(HostRecord(0, "dispatch", PHASE_REASON + phase))
        for weight, (k, v) in zip(weights, caches, strict=True):
            records += [
                OpRecord(0, "aten::mm", "mxu", "bfloat16", (x, weight), (y,), flops=2 * batch * tokens * dim * dim,
                         bytes_read=x.nbytes + weight.nbytes, bytes_written=y.nbytes,
                         matmul=(1, batch * tokens, dim, dim), source="model.py:10"),
                *([CollectiveRecord(0, "all_reduce", y.nbytes, tuple(range(tp)), (y,), (y,), reduce_op="sum",
                                    dtype="bfloat16", source="model.py:10")] if tp > 1 else []),
                OpRecord(0, "aten::index_copy_", "vpu", "bfloat16", (k, q), (k,), bytes_read=q.nbytes,
                         bytes_written=q.nbytes, source="model.py:11"),
                OpRecord(0, SDPA_OVERRIDEABLE, "mxu", "bfloat16", (q, k, v), (out,),
                         flops=4 * batch * heads * tokens * context * head_dim,
                         bytes_read=q.nbytes + k.nbytes + v.nbytes, bytes_written=out.nbytes, source="model.py:12"),
            ]
        if marked:
            records.append(HostRecord(0, "dispatch", PHASE_REASON + "end"))
    return Trace(renumber(records), world_size=max(1, tp))


def training_trace(steps: int = 3) -> Trace:
    """``steps`` steps of c = gelu(a @ b) then c.item(), at model.py:3-5."""
    records = []
    for step in range(steps):
        records += [
            MemoryRecord(0, "alloc", 3, C.nbytes),
            OpRecord(0, "aten::mm", "mxu", "bfloat16", (A, B), (C,), flops=2 * 64 * 128 * 64,
                     bytes_read=A.nbytes + B.nbytes, bytes_written=C.nbytes, matmul=(1, 64, 128, 64),
                     source="model.py:3"),
            OpRecord(0, "aten::gelu", "vpu", "bfloat16", (C,), (C,), flops=8 * 64 * 64, transcendentals=64 * 64,
                     bytes_read=C.nbytes, bytes_written=C.nbytes, source="model.py:4"),
            HostRecord(0, "sync", reason="item", source="model.py:5"),
            MemoryRecord(0, "free", 3, C.nbytes),
            StepMarker(0, step),
        ]
    return Trace(renumber(records))


def launch_ranks(script: Path, world: int, tmp_path: Path):
    """Run ``script`` as ``world`` ranks under ``--ranks all`` in this process: (result, seconds, output)."""
    import torch  # noqa: F401  (the launcher needs torch imported first)

    from tpusim.backend.distributed.launcher import launch

    stream = io.StringIO()
    started = time.monotonic()
    result = launch(script, [], world, 4, tmp_path, stream=stream)
    return result, time.monotonic() - started, stream.getvalue()


def sgd_steps(model, x, steps: int):
    """``steps`` SGD steps (lr 0.1) of ``model`` on the fixed batch ``x``, loss mean(model(x)**2); returns it."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return model


def train_linear(device: str, steps: int):
    """``sgd_steps`` of nn.Linear(8, 4) on a 16 x 8 batch, from seed 0 (record-budget tests run it on "tpu"
    and on CPU, their truth)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    return sgd_steps(model, torch.randn(16, 8).to(device), steps)
