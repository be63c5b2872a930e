"""torch.compile(model, backend="tpu"): numerics against CPU, training, StableHLO, graph breaks, recompiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import tpusim.backend as tb
from models import ElementwiseMLP, SmallTransformer, mlp_batch, train, transformer_batch


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.compile import reset_stats

    reset_stats()


def _compiled_losses(make: type, batch: tuple, steps: int = 3) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    ref = train(make(), batch, steps, "cpu")
    torch.manual_seed(0)
    model = make().to("tpu")
    got = train(model, batch, steps, "tpu", step_fn=torch.compile(model, backend="tpu"))
    return ref, got


def test_mlp_trains_like_cpu() -> None:
    ref, got = _compiled_losses(ElementwiseMLP, mlp_batch())
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)
    stats = tb.compile_stats()
    assert {g.kind for g in stats.graphs} == {"forward", "backward"}
    assert all(g.lowered for g in stats.graphs), stats.summary()


def test_transformer_trains_like_cpu() -> None:
    ref, got = _compiled_losses(SmallTransformer, transformer_batch())
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert all(g.lowered for g in tb.compile_stats().graphs)


def test_forward_output_lives_on_tpu_and_matches() -> None:
    model = SmallTransformer().eval()
    tokens, _ = transformer_batch()
    with torch.no_grad():
        ref = model(tokens)
        out = torch.compile(model.to("tpu"), backend="tpu")(tokens.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    assert [(g.kind, g.lowered) for g in tb.compile_stats().graphs] == [("inference", True)]


def test_stablehlo_dump_of_the_transformer(tmp_path: object) -> None:
    model = SmallTransformer().to("tpu")
    tokens, _ = transformer_batch()
    text = tb.dump_stablehlo(model, tokens.to("tpu"), path=tmp_path / "transformer.mlir")
    assert "func.func public @main" in text and "stablehlo.dot_general" in text
    assert text.count("// tpusim graph") == 2            # forward and backward
    assert (tmp_path / "transformer.mlir").read_text() == text
    assert all(p.grad is None for p in model.parameters())


def test_graph_breaks_are_counted_with_reason_and_line() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        if y.sum().item() > 0:          # data-dependent branch: a graph break
            y = y * 2
        return y.cos()

    x = torch.randn(8, device="tpu")
    out = torch.compile(fn, backend="tpu")(x)
    torch.testing.assert_close(out.cpu(), fn(x.cpu()))
    breaks = tb.compile_stats().graph_breaks
    assert breaks and any("test_compile.py" in b.source for b in breaks)
    assert any("item" in b.reason.lower() or "scalar" in b.reason.lower() for b in breaks), breaks


def test_recompilations_are_counted_with_reason() -> None:
    fn = torch.compile(lambda x: F.relu(x) + 1, backend="tpu", dynamic=False)
    fn(torch.randn(4, device="tpu"))
    fn(torch.randn(4, device="tpu"))
    fn(torch.randn(6, device="tpu"))
    stats = tb.compile_stats()
    assert len(stats.recompiles) == 1 and "size" in stats.recompiles[0].reason.lower()
    assert "recompiled" in stats.summary()


def test_missing_lowering_runs_eagerly_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpusim.backend.lowering import registry

    table = dict(registry.LOWERINGS)
    del table[torch.ops.aten.sin.default]
    monkeypatch.setattr(registry, "LOWERINGS", table)
    x = torch.randn(5, device="tpu")
    with pytest.warns(RuntimeWarning, match="aten.sin.default"):
        out = torch.compile(lambda v: v.sin() + 1, backend="tpu")(x)
    torch.testing.assert_close(out.cpu(), x.cpu().sin() + 1)
    assert not tb.compile_stats().graphs[0].lowered
