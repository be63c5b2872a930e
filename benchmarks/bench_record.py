"""How fast the device records in shape-only mode: a GPT-3-175B-shaped training step on "tpu".

    python benchmarks/bench_record.py [--steps 2] [--layers 96] [--batch 1]

The model is GPT-3 175B's shape (96 layers, d_model 12288, 96 heads, seq 2048, vocab 50257;
Brown et al. 2020, table 2.1), built with device="tpu" in shape-only mode (TPUSIM_NUMERICS=off:
tensors have shapes, no values, and no host memory: the 700 GB of float32 parameters are
address space only) with the HBM limit off. Each step (forward, cross-entropy, backward, AdamW)
runs while recording; printed: each step's wall time, and records per second over the steps
and the recording's stop (the trace built from the device's log), and per step. Target: >= 50,000
records/s.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import tpusim.backend as tb
from tpusim.trace.records import MemoryRecord, OpRecord

VOCAB, D_MODEL, HEADS, SEQ = 50257, 12288, 96, 2048


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim, device="tpu"), nn.LayerNorm(dim, device="tpu")
        self.qkv = nn.Linear(dim, 3 * dim, device="tpu")
        self.proj = nn.Linear(dim, dim, device="tpu")
        self.up = nn.Linear(dim, 4 * dim, device="tpu")
        self.down = nn.Linear(4 * dim, dim, device="tpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, dim: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, device="tpu")
        self.pos = nn.Embedding(SEQ, dim, device="tpu")
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim, device="tpu")
        self.head = nn.Linear(dim, VOCAB, bias=False, device="tpu")
        self.head.weight = self.embed.weight          # tied, as GPT-3

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device="tpu"))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    tb.configure(tb.load_config(numerics=False, hbm_bytes=0))   # before the first tensor on the device

    start = time.perf_counter()
    model = GPT(args.layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (args.batch, SEQ), device="tpu")
    params = sum(p.numel() for p in model.parameters())
    print(f"GPT-3-shaped model: {args.layers} layers, d_model {D_MODEL}, {HEADS} heads, seq {SEQ}, batch {args.batch}: "
          f"{params / 1e9:.1f}B parameters, built in {time.perf_counter() - start:.1f} s (shape-only)")

    step_times, step_records = [], []
    with tb.recording() as rec:
        for _ in range(args.steps):
            before = len(rec.records)
            t0 = time.perf_counter()
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()                                # its step marker brings the records up to date
            step_times.append(time.perf_counter() - t0)
            step_records.append(len(rec.records) - before)
        stop_from = time.perf_counter()
    stop_s = time.perf_counter() - stop_from
    trace = rec.trace
    records = len(trace.records)
    ops = len(trace.of_kind(OpRecord))
    memory = len(trace.of_kind(MemoryRecord))
    total = sum(step_times) + stop_s
    print(f"{records} records ({ops} ops, {memory} allocations/frees) in {args.steps} steps; "
          f"steps {', '.join(f'{t:.2f}' for t in step_times)} s; recording stop (trace built) {stop_s:.2f} s")
    per_step = ", ".join(f"{n / t:,.0f}" for n, t in zip(step_records, step_times, strict=True))
    print(f"records/s: {records / total:,.0f} (target >= 50,000; per step: {per_step}; the first step also fills "
          f"the shape caches and AdamW's state); ops/s: {ops / total:,.0f}; {total / args.steps:.2f} s per step")
    assert math.isfinite(total)


if __name__ == "__main__":
    main()
