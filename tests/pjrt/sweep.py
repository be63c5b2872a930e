"""OpInfo sweep of the lowering table against CPU PyTorch (shared by the tests and ``python -m``).

Each ``op_db`` sample is traced to a Core ATen graph (``make_fx`` with functionalization and
PyTorch's core-ATen decompositions, the same graph shape torch.compile hands the backend), run
through the lowering table in JAX (eager, no jit: the sweep checks semantics, not compile), and
compared with the CPU result. Usage: ``python tests/pjrt/sweep.py [--samples N] [ops...]``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

import tpusim.backend  # noqa: F401  (import torch first, then the device)
from tpusim.backend import lowering

# Reasoned skiplist: op_db entries whose semantics the table cannot or should not match.
SKIP: dict[str, str] = {
    "nonzero_static": "output padded to a static size by a CPU-only kernel",
    "_segment_reduce": "no core ATen decomposition; CPU/CUDA-only kernel",
    "segment_reduce": "no core ATen decomposition; CPU/CUDA-only kernel",
    "sparse.sampled_addmm": "sparse layouts are not lowered",
    "sparse.mm": "sparse layouts are not lowered",
    "to_sparse": "sparse layouts are not lowered",
    "item": "host read, not a device op (_local_scalar_dense leaves the graph)",
    "equal": "returns a Python bool (data-dependent host control flow)",
    "allclose": "returns a Python bool (data-dependent host control flow)",
    "tolist": "host read",
    "histc": "data-dependent output shape in make_fx",
    "bincount": "data-dependent output shape",
    "unique": "data-dependent output shape",
    "unique_consecutive": "data-dependent output shape",
    "nn.functional.ctc_loss": "CPU-only kernel, no decomposition",
    "linalg.eigvals": "LAPACK ops: not part of Core ATen, no TPU lowering in XLA either",
    "empty": "uninitialised memory: no defined values to compare",
    "empty_like": "uninitialised memory: no defined values to compare",
    "new_empty": "uninitialised memory: no defined values to compare",
    "new_empty_strided": "uninitialised memory: no defined values to compare",
    "empty_strided": "uninitialised memory: no defined values to compare",
    "empty_permuted": "uninitialised memory: no defined values to compare",
    "chalf": "complex32 has no XLA type",
    "corrcoef": "reads a value on the host while tracing (data-dependent), so it never forms one graph",
    "cov": "reads a value on the host while tracing (data-dependent), so it never forms one graph",
    "narrow": "the sample passes a tensor start: its value is read on the host (graph break in Dynamo)",
    "take": "bounds check reads a value on the host while tracing",
    "tensor_split": "a tensor of split points: sizes read on the host while tracing",
    "nn.functional.gaussian_nll_loss": "input validation reads a value on the host while tracing",
    "as_strided": "partial_views samples read outside the view's base, which a functional graph cannot express",
    "multinomial": "random: only shapes comparable; draws differ from CPU by design",
    "nn.functional.rrelu": "random: draws differ from CPU by design",
    "resize_": "storage resize is a host memory operation, not a value computation",
    "resize_as_": "storage resize is a host memory operation, not a value computation",
    "hash_tensor": "bit-level hash of the CPU kernel; no Core ATen decomposition",
    "histogram": "no Core ATen decomposition (CPU-only kernel); data-dependent binning",
    "histogramdd": "no Core ATen decomposition (CPU-only kernel); data-dependent binning",
    "norm.nuc": "nuclear norm variant needs an SVD (LAPACK family)",
    "jiterator_unary": "CUDA-only",
    "jiterator_binary": "CUDA-only",
    "jiterator_4inputs_with_extra_args": "CUDA-only",
    "jiterator_binary_return_by_ref": "CUDA-only",
    "jiterator_2inputs_2outputs": "CUDA-only",
}
# op_db families outside Core ATen's reach (LAPACK, sparse, quantized, special functions XLA lacks)
SKIP_PREFIXES = ("linalg.", "cholesky", "lu", "qr", "svd", "pinverse", "triangular_solve", "ormqr",
                 "geqrf", "matrix_exp", "logdet", "det", "inverse", "eig", "symeig", "lstsq", "pca_lowrank",
                 "svd_lowrank", "torch_nn.", "nn.functional.linear_cross_entropy", "sparse.", "_refs.", "special.",
                 "fft.", "torch._scaled_mm", "_upsample_bilinear2d_aa",
                 "nn.functional.ctc", "signal.")


@dataclass
class Result:
    name: str
    passed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    ops: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


def _trace(fn: object, tensors: list[torch.Tensor]) -> torch.fx.GraphModule:
    from torch.func import functionalize

    return make_fx(functionalize(fn, remove="mutations_and_views"), decomposition_table=core_aten_decompositions(),
                   tracing_mode="real")(*tensors)


def run_sample(op: object, sample: object) -> tuple[bool, str, set[str], set[str]]:
    """(passed, error, aten ops used, ops missing from the table) of one OpInfo sample."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def fn(*tensors: torch.Tensor) -> object:
        vals = list(leaves)
        for i, t in zip(idx, tensors):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        return op.op(inp, *args, **kwargs)

    tensors = [leaves[i] for i in idx]
    expected = fn(*[t.clone() for t in tensors])
    gm = _trace(fn, [t.clone() for t in tensors])
    used = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload)}
    missing = set(lowering.missing_ops(gm))
    if missing:
        return False, f"missing {sorted(missing)}", used, missing
    key = None
    from tpusim.backend.lowering.interpreter import needs_random

    if needs_random(gm):
        return True, "", used, missing        # random: only shapes are comparable, covered elsewhere
    got = lowering.jax_function(gm)(*[lowering.tensor_to_jax(t) for t in tensors], *([key] if key else []))
    exp_leaves = [v for v in pytree.tree_leaves(expected)]
    if len(got) != len(exp_leaves):
        return False, f"{len(got)} outputs, expected {len(exp_leaves)}", used, missing
    import numpy as np

    for g, e in zip(got, exp_leaves):
        if isinstance(e, torch.Tensor):
            gt = torch.from_numpy(np.array(g, copy=True)) if e.dtype != torch.bfloat16 else \
                torch.from_numpy(np.array(g.astype("float32"))).to(torch.bfloat16)
            if tuple(gt.shape) != tuple(e.shape):
                return False, f"shape {tuple(gt.shape)} != {tuple(e.shape)}", used, missing
            if gt.dtype != e.dtype:
                return False, f"dtype {gt.dtype} != {e.dtype}", used, missing
            try:
                torch.testing.assert_close(gt, e.detach(), atol=1e-4, rtol=1e-4, equal_nan=True,
                                           check_stride=False)
            except AssertionError as err:
                return False, str(err).splitlines()[0][:200], used, missing
        elif g != e and not (isinstance(e, float) and isinstance(g, float)):
            return False, f"value {g} != {e}", used, missing
    return True, "", used, missing


def skipped(name: str) -> str | None:
    if name in SKIP:
        return SKIP[name]
    if name.startswith(SKIP_PREFIXES):
        return "family outside Core ATen (LAPACK / sparse / refs / special / fft wrappers)"
    return None


def sweep(names: list[str] | None = None, samples: int = 3, dtype: torch.dtype = torch.float32) -> dict[str, Result]:
    from torch.testing._internal.common_methods_invocations import op_db

    results: dict[str, Result] = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if names and op.name not in names and name not in names:
            continue
        if skipped(op.name) or skipped(name) or dtype not in op.supported_dtypes("cpu"):
            continue
        res = results.setdefault(name, Result(name))
        try:
            it = op.sample_inputs("cpu", dtype, requires_grad=False)
            for i, sample in enumerate(it):
                if i >= samples:
                    break
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        ok, err, used, missing = run_sample(op, sample)
                except Exception as exc:  # noqa: BLE001  (a sweep reports, it does not stop)
                    ok, err, used, missing = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", \
                        set(), set()
                res.ops |= used
                res.missing |= missing
                if ok:
                    res.passed += 1
                else:
                    res.failed += 1
                    res.errors.append(err)
        except Exception as exc:  # noqa: BLE001  (sample generation itself failed)
            res.errors.append(f"samples: {type(exc).__name__}: {exc}")
            res.failed += 1
    return results


def core_op_status(results: dict[str, Result]) -> tuple[set[str], set[str]]:
    """Core ATen overloads exercised by passing entries, and those seen only in failing ones."""
    good, bad = set(), set()
    for r in results.values():
        (good if r.ok else bad).update(r.ops)
    core = {str(op) for op in _core_ops()}
    return good & core, (bad - good) & core


def _core_ops() -> list:
    """Every Core ATen overload. ``dir(torch.ops.aten)`` lists only the packets touched so far in the process, so
    every registered aten name is touched first: the answer no longer depends on which tests ran before."""
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith("aten::"):
            getattr(torch.ops.aten, qualified.removeprefix("aten::").split(".")[0], None)
    out = []
    for name in dir(torch.ops.aten):
        pk = getattr(torch.ops.aten, name)
        if isinstance(pk, torch._ops.OpOverloadPacket):
            out.extend(op for o in pk.overloads() if torch.Tag.core in (op := getattr(pk, o)).tags)
    return out


def summary(results: dict[str, Result]) -> str:
    tested = [r for r in results.values() if r.passed + r.failed]
    passed = [r for r in tested if r.ok]
    good, bad = core_op_status(results)
    core = _core_ops()
    covered = [op for op in core if lowering.covered(op)]
    return (f"op_db entries: {len(passed)}/{len(tested)} pass ({100 * len(passed) / max(len(tested), 1):.1f}%); "
            f"core ATen overloads with a lowering: {len(covered)}/{len(core)} "
            f"({100 * len(covered) / len(core):.1f}%); core overloads exercised: {len(good | bad)}, "
            f"in passing samples only-or-also: {len(good)}, only in failing samples: {len(bad)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ops", nargs="*")
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    start = time.perf_counter()
    results = sweep(args.ops or None, args.samples)
    reasons = Counter()
    for r in results.values():
        if not r.ok and (r.passed + r.failed):
            print(f"FAIL {r.name}: {r.errors[0] if r.errors else ''}")
            reasons[r.errors[0].split(":")[0] if r.errors else "?"] += 1
    print(summary(results), f"[{time.perf_counter() - start:.0f} s]")


if __name__ == "__main__":
    main()
