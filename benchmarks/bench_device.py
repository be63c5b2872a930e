"""Wall time of a small-transformer training step on CPU vs on "tpu" (recording on), side by side.

    python benchmarks/bench_device.py [--steps 10] [--profile]

The tpu device runs every op as the CPU kernel on host aliases, so the difference is the
device's own overhead: the Python fallback (argument conversion, result mapping) and the
recorder (cost rules, tensor metadata, source lines). Goal: tpu/CPU <= 1.3x.
``--profile`` prints where the tpu step's time goes (cProfile, top functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
import tpusim.backend as tb
from torch import nn


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


def make(device: str, args: argparse.Namespace) -> tuple:
    torch.manual_seed(0)
    model = SmallTransformer(args.vocab, args.dim, args.heads, args.layers, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    targets = torch.randint(0, args.vocab, (args.batch * args.seq,), generator=g).to(device)
    return model, opt, tokens, targets


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def timed(setup: tuple, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train_step(*setup)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    cpu, tpu = make("cpu", args), make("tpu", args)
    timed(cpu, 2)
    timed(tpu, 2)
    cpu_times, tpu_times = [], []
    with tb.recording() as rec:
        for _ in range(args.steps):           # interleave so both see the same machine load
            cpu_times += timed(cpu, 1)
            tpu_times += timed(tpu, 1)
    ops = len([r for r in rec.trace.records if r.kind == "op"]) // max(args.steps, 1)
    c, t = statistics.median(cpu_times), statistics.median(tpu_times)
    print(f"small transformer: batch {args.batch} x seq {args.seq}, dim {args.dim}, {args.layers} layers; "
          f"median of {args.steps} steps; {ops} recorded tpu ops per step")
    print(f"{'device':>8} {'step (ms)':>10}")
    print(f"{'cpu':>8} {c * 1e3:10.1f}")
    print(f"{'tpu':>8} {t * 1e3:10.1f}   (recording on)")
    print(f"ratio tpu/cpu: {t / c:.2f}x  (goal <= 1.3x); overhead per op: {(t - c) / max(ops, 1) * 1e6:.0f} us")
    if args.profile:
        prof = cProfile.Profile()
        with tb.recording():
            prof.enable()
            timed(tpu, 3)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
