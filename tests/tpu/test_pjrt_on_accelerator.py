"""The PJRT target and torch.compile on a real TPU/GPU: numerics against CPU at accelerator tolerances."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pjrt"))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_transformer_trains_on_the_accelerator(mode: str) -> None:
    from models import SmallTransformer, train, transformer_batch

    import tpusim
    from tpusim.backend.targets import pjrt

    torch.manual_seed(0)
    ref = train(SmallTransformer(), transformer_batch(), 3, "cpu")
    previous = tpusim.get_eager_mode()
    pjrt.enable(mode)                               # the PJRT target follows the eager mode it sets
    try:
        torch.manual_seed(0)
        got = train(SmallTransformer(), transformer_batch(), 3, "tpu")
    finally:
        pjrt.disable()
        tpusim.set_eager_mode(previous)
    assert got == pytest.approx(ref, rel=2e-3)     # TPU matmuls: HIGHEST precision is exact-f32 passes
    assert mode == "strict" or pjrt.stats().windows > 0


def test_compiled_graph_runs_on_the_accelerator() -> None:
    import jax
    from models import ElementwiseMLP, mlp_batch, train

    torch.manual_seed(0)
    ref = train(ElementwiseMLP(), mlp_batch(), 3, "cpu")
    torch.manual_seed(0)
    model = ElementwiseMLP().to("tpu")
    got = train(model, mlp_batch(), 3, "tpu", step_fn=torch.compile(model, backend="tpu"))
    assert got == pytest.approx(ref, rel=2e-3)
    assert jax.devices()[0].platform in ("tpu", "gpu")
