"""The tpu device's overhead: a transformer training step on CPU vs on "tpu" (recording on), side by side.

    python benchmarks/bench_device.py [--steps 20] [--profile]

The tpu device runs every op as the CPU kernel on host aliases, so the difference is the
device's own work: the fallback (argument conversion, result mapping) and the recorder (cost
rules, tensor metadata, source lines, the records). Two sizes of the same model, CPU and tpu
steps interleaved so both see the same machine load, medians of the per-step differences:

- tiny (overhead-bound: each op a few microseconds on CPU): the device overhead per op,
  (tpu step - CPU step) / recorded ops. Target: <= 20 us per op.
- small (compute-bound, the default sizes before issue 13): tpu/CPU step time. Target: <= 1.3x.

``--profile`` prints where the tiny tpu step's Python time goes (cProfile, top functions by own
time); the common op runs in C++ (tpusim/backend/csrc/fallback.cpp) and shows up inside the torch call.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import warnings

import torch
from torch import nn

import tpusim.backend as tb
from tpusim.trace.records import OpRecord

SIZES = {  # batch, seq, dim, heads, layers, vocab
    "tiny": (4, 32, 64, 2, 2, 500),
    "small": (16, 128, 256, 4, 2, 2000),
}


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        with warnings.catch_warnings():          # enable_nested_tensor does not apply to norm_first
            warnings.simplefilter("ignore")
            self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


def make(device: str, size: str) -> tuple:
    batch, seq, dim, heads, layers, vocab = SIZES[size]
    torch.manual_seed(0)
    model = SmallTransformer(vocab, dim, heads, layers, seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    targets = torch.randint(0, vocab, (batch * seq,), generator=g).to(device)
    return model, opt, tokens, targets


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def timed(setup: tuple) -> float:
    start = time.perf_counter()
    train_step(*setup)
    return time.perf_counter() - start


def compare(size: str, steps: int) -> tuple[float, float, float, int]:
    """(median CPU step, median tpu step, median per-step difference) in seconds, and recorded ops per step."""
    cpu, tpu = make("cpu", size), make("tpu", size)
    for _ in range(2):
        timed(cpu)
        timed(tpu)
    cpu_times, tpu_times = [], []
    with tb.recording() as rec:
        for _ in range(steps):               # interleaved: both see the same machine load
            cpu_times.append(timed(cpu))
            tpu_times.append(timed(tpu))
    ops = len(rec.trace.of_kind(OpRecord)) // steps
    diffs = [t - c for c, t in zip(cpu_times, tpu_times, strict=True)]
    return statistics.median(cpu_times), statistics.median(tpu_times), statistics.median(diffs), ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    print(f"{'model':>6} {'batch x seq':>11} {'dim':>4} {'ops/step':>8} {'cpu (ms)':>9} {'tpu (ms)':>9} "
          f"{'tpu/cpu':>7} {'overhead/op':>11}")
    for size in SIZES:
        batch, seq, dim = SIZES[size][:3]
        c, t, diff, ops = compare(size, args.steps)
        print(f"{size:>6} {f'{batch} x {seq}':>11} {dim:>4} {ops:>8} {c * 1e3:9.2f} {t * 1e3:9.2f} {t / c:6.2f}x "
              f"{diff / max(ops, 1) * 1e6:8.1f} us")
    print(f"transformer training step (AdamW), recording on; medians of {args.steps} interleaved steps; "
          f"targets: overhead <= 20 us per op (tiny), tpu/cpu <= 1.3x (small)")
    if args.profile:
        tpu = make("tpu", "tiny")
        timed(tpu)
        prof = cProfile.Profile()
        with tb.recording():
            prof.enable()
            for _ in range(5):
                timed(tpu)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
