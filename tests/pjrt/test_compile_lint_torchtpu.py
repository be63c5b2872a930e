"""torch.compile pitfalls on TorchTPU, recorded and linted: a compiled graph run under torch.inference_mode() (it
works here, fails on TorchTPU) and a recompile per value of a Python float (each new value a new compile)."""

from __future__ import annotations

import inspect

import pytest
import torch

import tpusim.backend as tb
from tpusim.report.lint import lint
from tpusim.slice.topology import build_slice

CHIP = build_slice("3d:1x1x1", "v5p").chip
HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

    reset_stats()


def _scaled(x: torch.Tensor, c: float) -> torch.Tensor:
    return (x * c).relu()


def test_a_compiled_graph_run_under_inference_mode_is_named_and_under_no_grad_is_not() -> None:
    compiled = torch.compile(_scaled, backend="tpu")
    x = torch.randn(8, 4, device="tpu")
    with tb.recording() as quiet, torch.no_grad():
        expected = compiled(x, 2.0)
    assert quiet.trace.meta.inference_mode_compiles is None
    assert not [w for w in lint(quiet.trace, CHIP) if w.code == "compile-inference-mode"]
    with tb.recording() as rec, torch.inference_mode():
        got = compiled(x, 2.0)
    assert torch.equal(got, expected)            # tpusim runs it; TorchTPU's torch.compile would not
    (found,) = [w for w in lint(rec.trace, CHIP) if w.code == "compile-inference-mode"]
    assert found.source.startswith(f"{HERE}:") and "use torch.no_grad() instead" in found.message


def test_a_python_float_that_changes_names_the_recompile_cause() -> None:
    compiled = torch.compile(_scaled, backend="tpu", dynamic=False)
    x = torch.randn(8, 4, device="tpu")
    with tb.recording() as rec:
        compiled(x, 0.5)
        compiled(x, 1.5)
    causes = [w for w in lint(rec.trace, CHIP) if w.code == "dynamo-recompile"]
    assert causes and "a Python number that changes between calls is a constant" in causes[0].message
    assert causes[0].source == f"{HERE}:{inspect.getsourcelines(_scaled)[1] + 1}"     # the line using c
    with tb.recording() as steady:
        compiled(x, 0.5)                         # a value seen before: no new recompile (Dynamo's facts accumulate)
    assert len([w for w in lint(steady.trace, CHIP) if w.code == "dynamo-recompile"]) == len(causes)
