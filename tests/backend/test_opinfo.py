"""OpInfo conformance: PyTorch's own ``op_db`` on "tpu" against CPU.

Each entry (op variant x dtype, float32 and bfloat16) runs its first samples forward, on
contiguous and non-contiguous inputs, and backward where the op supports autograd (float32);
random ops run with the same seed on both devices. Entries that fail on CPU itself do not
count. Shards run in subprocesses, so one crashing op cannot take the suite down.

    pytest tests/backend/test_opinfo.py            # CI subset (fast)
    pytest tests/backend/test_opinfo.py -m slow    # the full op_db sweep; prints the pass rate
    python tests/backend/test_opinfo.py --subset full --shard 0 --of 1   # one shard, JSON out

``EXPECTED_FAILURES`` gives the reason for each entry known to differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

DTYPES = ("float32", "bfloat16")
SAMPLES = 3
CI_OPS = ("add", "sub", "mul", "div", "matmul", "mm", "bmm", "addmm", "nn.functional.linear", "sum", "mean",
          "amax", "softmax", "log_softmax", "exp", "tanh", "sigmoid", "nn.functional.gelu", "nn.functional.relu",
          "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.embedding", "index_select",
          "gather", "scatter_add", "cat", "stack", "where", "clamp", "transpose", "reshape", "view", "expand",
          "nn.functional.cross_entropy", "nn.functional.scaled_dot_product_attention", "cumsum", "sort",
          "topk", "arange", "zeros_like", "full", "nn.functional.dropout", "masked_fill", "pow", "rsqrt")

# (op name[.variant], dtype or "*") -> why it differs on tpu; failures listed here still count
# against the pass rate, the table only documents them.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {
    ("sparse.mm.reduce", "*"): "sparse layouts are not supported on tpu (strided tensors only)",
    ("sparse.sampled_addmm", "*"): "sparse layouts are not supported on tpu (strided tensors only)",
    ("to_sparse", "*"): "sparse layouts are not supported on tpu (strided tensors only)",
    ("tensor_split", "*"): "harness moves every sample tensor to tpu; the indices must stay on CPU, as on CUDA",
}
# ops whose outputs are uninitialized memory: only shapes and dtypes are compared
UNINITIALIZED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}


def _key(op: object) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _compare(a: object, b: object, dtype: object) -> None:
    import torch

    tol = {"atol": 1e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(a, b, check_device=False, equal_nan=True, **tol)


def _to_cpu(x: object) -> object:
    import torch

    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _run_entry(op: object, dtype: object) -> str:
    """'pass', 'fail: ...', or 'cpu' (fails on CPU too: not counted)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    grad = op.supports_autograd and dtype == torch.float32
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))[:SAMPLES]
    except Exception:
        return "cpu"
    if not samples:
        return "cpu"
    for contiguous in (True, False):
        for sample in samples:
            results = []
            for device in ("cpu", "tpu"):
                def move(x: object, device: str = device) -> object:
                    if isinstance(x, torch.Tensor):
                        y = x.detach().to(device)
                        return y.requires_grad_(x.requires_grad)
                    return x
                s = sample.transform(move)
                if not contiguous:                 # made non-contiguous on the device itself
                    s = s.noncontiguous()
                try:
                    torch.manual_seed(0)
                    out = op(s.input, *s.args, **s.kwargs)
                    flat = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
                    grads: list = []
                    leaves = [t for t in tree_flatten((s.input, s.args, s.kwargs))[0]
                              if isinstance(t, torch.Tensor) and t.requires_grad]
                    diff = [o for o in flat if o.requires_grad]
                    if grad and leaves and diff:
                        total = sum(o.float().sum() for o in diff)
                        grads = list(torch.autograd.grad(total, leaves, allow_unused=True))
                    results.append((tree_map(_to_cpu, out), [_to_cpu(g) for g in grads]))
                except Exception as err:  # noqa: BLE001 - any failure is a result here
                    if device == "cpu":
                        return "cpu"
                    return f"fail: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
            if op.name in UNINITIALIZED:
                meta = [tree_map(lambda x: (list(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else x, r[0])
                        for r in results]
                if meta[0] != meta[1]:
                    return f"fail: shape/dtype mismatch: {meta[1]} vs {meta[0]}"
                continue
            try:
                _compare(results[1][0], results[0][0], dtype)
                _compare(results[1][1], results[0][1], dtype)
            except Exception as err:  # noqa: BLE001
                return f"fail: mismatch ({'contiguous' if contiguous else 'non-contiguous'}): " \
                       f"{str(err).splitlines()[0][:200]}"
    return "pass"


def run_shard(subset: str, shard: int, of: int, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    import warnings

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import tpusim.backend  # noqa: F401  (before torch.testing, so PrivateUse1 is seen)

    warnings.filterwarnings("ignore")
    ops = [op for op in op_db if subset == "full" or op.name in CI_OPS]
    results = {}
    for i, op in enumerate(ops):
        if i % of != shard or _key(op) in skip:
            continue
        print(f"RUNNING {_key(op)}", file=sys.stderr, flush=True)
        for name in DTYPES:
            dtype = getattr(torch, name)
            if dtype not in op.supported_dtypes("cpu"):
                continue
            results[f"{_key(op)}|{name}"] = _run_entry(op, dtype)
    return results


def _run_shard_process(subset: str, shard: int, of: int, skip: set[str]) -> subprocess.Popen:
    here = Path(__file__).resolve()
    return subprocess.Popen([sys.executable, str(here), "--subset", subset, "--shard", str(shard), "--of", str(of),
                             "--skip", ",".join(sorted(skip))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def sweep(subset: str, shards: int, parallel: int = 2) -> dict[str, str]:
    """Run every shard in its own interpreter; when one crashes, the op it was running is
    recorded as a crash and the shard is rerun without it."""
    results: dict[str, str] = {}
    skips: dict[int, set[str]] = {i: set() for i in range(shards)}
    pending = list(range(shards))
    while pending:
        batch, pending = pending[:parallel], pending[parallel:]
        procs = [(i, _run_shard_process(subset, i, shards, skips[i])) for i in batch]
        for i, proc in procs:
            out, err = proc.communicate(timeout=1800)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if proc.returncode == 0 and lines:
                results.update(json.loads(lines[-1]))
                continue
            running = [line[8:] for line in err.splitlines() if line.startswith("RUNNING ")]
            if not running or running[-1] in skips[i]:
                results[f"<shard {i}>|*"] = f"fail: crash rc={proc.returncode}: {err[-300:]}"
                continue
            skips[i].add(running[-1])
            for name in DTYPES:
                results[f"{running[-1]}|{name}"] = f"fail: crash (rc={proc.returncode})"
            pending.append(i)
    return results


def summarize(results: dict[str, str]) -> tuple[int, int, list[str]]:
    counted = {k: v for k, v in results.items() if v != "cpu"}
    passed = sum(v == "pass" for v in counted.values())
    failures = sorted(f"{k}: {v}" for k, v in counted.items() if v != "pass")
    return passed, len(counted), failures


def _report(results: dict[str, str], label: str) -> float:
    passed, total, failures = summarize(results)
    rate = passed / max(total, 1)
    print(f"\nOpInfo {label}: {passed}/{total} entries pass on tpu ({rate:.1%}) of those that pass on CPU")
    for line in failures:
        name, dtype = line.split(":")[0].split("|")
        reason = EXPECTED_FAILURES.get((name, dtype)) or EXPECTED_FAILURES.get((name, "*"))
        print(f"  {line}" + (f"   [known: {reason}]" if reason else ""))
    return rate


def test_opinfo_ci_subset() -> None:
    results = sweep("ci", shards=1, parallel=1)
    rate = _report(results, "CI subset")
    assert rate >= 0.97


@pytest.mark.slow
def test_opinfo_full_sweep() -> None:
    results = sweep("full", shards=8)
    rate = _report(results, "full sweep")
    assert rate >= 0.97


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--subset", default="ci", choices=("ci", "full"))
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--of", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma-separated op names to leave out (crashed before)")
    parser.add_argument("--sweep", action="store_true", help="run all shards and print the pass rate")
    cli = parser.parse_args()
    if cli.sweep:
        _report(sweep(cli.subset, shards=cli.of), cli.subset)
    else:
        print(json.dumps(run_shard(cli.subset, cli.shard, cli.of, frozenset(filter(None, cli.skip.split(","))))))
