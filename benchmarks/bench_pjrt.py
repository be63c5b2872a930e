"""Wall time per training step on the PJRT target (jax-CPU here): Strict vs Fused vs compiled, side by side.

    python benchmarks/bench_pjrt.py [--steps 10] [--warmup 3]

Models: the elementwise-heavy MLP and the small transformer of tests/pjrt/models.py, trained
with SGD+momentum. Columns:

- cpu: plain PyTorch on the CPU (reference);
- strict: eager mode strict on "tpu", every op one cached jitted JAX computation (per op signature);
- fused: eager mode fused on "tpu", tpusim.eager.fusion's windows traced into one jitted JAX computation
  each (the line under the table says how many windows a step ends, and why);
- compiled: torch.compile(model, backend="tpu") (forward and backward graphs as two XLA
  programs), the optimizer eager in Strict.

``pjrt.enable(column)`` sets the eager mode (tpusim.set_eager_mode) and the target follows it.

Warm-up steps (compiles) are excluded; the median of the timed steps is reported. Goal: Fused
>= 1.5x faster than Strict on the MLP. On jax-CPU these are host-side dispatch and fusion
effects, not TPU speeds (JAX's device is the CPU: compare shapes, not absolute times).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import tpusim.backend  # noqa: F401  (the tpu device)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "pjrt"))
from models import ElementwiseMLP, SmallTransformer, mlp_batch, transformer_batch  # noqa: E402


def _setup(make: object, batch: tuple, device: str, compiled: bool) -> tuple:
    torch.manual_seed(0)
    model = make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = (t.to(device) for t in batch)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    return fwd, opt, x, y


def _step(fwd: object, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad(set_to_none=True)
    out = fwd(x)
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
    loss.backward()
    opt.step()
    return loss.item()


def measure(make: object, batch: tuple, column: str, steps: int, warmup: int) -> tuple[float, float, str]:
    """(median seconds per step, last loss, the fused windows of one timed step) of one column."""
    from tpusim.backend.targets import pjrt

    device = "cpu" if column == "cpu" else "tpu"
    if column in ("strict", "fused"):
        pjrt.enable(column)
    elif column == "compiled":
        pjrt.enable("strict")
    try:
        setup = _setup(make, batch, device, column == "compiled")
        for _ in range(warmup):
            _step(*setup)
        times, loss = [], 0.0
        pjrt.reset_stats()
        for _ in range(steps):
            start = time.perf_counter()
            loss = _step(*setup)
            times.append(time.perf_counter() - start)
        return statistics.median(times), loss, _windows(pjrt.stats(), steps)
    finally:
        pjrt.disable()


def _windows(stats: object, steps: int) -> str:
    """Fused windows per timed step and their cuts (tpusim.eager.fusion's names), or "" outside fused."""
    if not stats.windows:
        return ""
    cuts = ", ".join(f"{k} {v / steps:g}" for k, v in sorted(stats.cuts.items()))
    return f"fused: {stats.windows / steps:g} windows per step (cuts per step: {cuts})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}); "
          f"torch {torch.__version__}; {args.steps} timed steps after {args.warmup} warm-up")
    models = {"elementwise MLP": (lambda: ElementwiseMLP(dim=256, depth=4), mlp_batch(batch=64, dim=256)),
              "small transformer": (SmallTransformer, transformer_batch())}
    columns = ["cpu", "strict", "fused", "compiled"]
    print(f"{'model':18s}" + "".join(f"{c + ' ms':>14s}" for c in columns) + f"{'strict/fused':>14s}"
          f"{'strict/compiled':>17s}")
    for name, (make, batch) in models.items():
        res = {c: measure(make, batch, c, args.steps, args.warmup) for c in columns}
        line = f"{name:18s}" + "".join(f"{1e3 * res[c][0]:14.2f}" for c in columns)
        line += f"{res['strict'][0] / res['fused'][0]:13.2f}x{res['strict'][0] / res['compiled'][0]:16.2f}x"
        print(line)
        print(f"{'':18s}" + "".join(f"{'loss ' + format(res[c][1], '.4f'):>14s}" for c in columns))
        print(f"{'':18s}{res['fused'][2]}")


if __name__ == "__main__":
    main()
