"""torch.compile(model, backend="tpu"): numerics against CPU, training, StableHLO, graph breaks, recompiles."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models import ElementwiseMLP, SmallTransformer, mlp_batch, train, transformer_batch

import tpusim.backend as tb


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    from tpusim.backend.torch_compile.jax_backend import reset_stats

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


def _branchy(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    if y.sum().item() > 0:          # data-dependent branch: a graph break
        y = y * 2
    return y.cos()


def test_graph_breaks_are_counted_with_reason_and_line() -> None:
    x = torch.randn(8, device="tpu")
    out = torch.compile(_branchy, backend="tpu")(x)
    torch.testing.assert_close(out.cpu(), _branchy(x.cpu()))
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


# ---- the sim target prices a compiled graph as one program ------------------------------------------------------
def _mlp_steps(compiled: bool, steps: int = 2) -> object:
    """Record ``steps`` SGD steps of a 256-1024-256 MLP (batch 64) after one warm-up step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="tpu")
    run = torch.compile(model, backend="tpu") if compiled else model

    def step() -> None:
        run(x).pow(2).mean().backward()     # the line the graphs' ops are attributed to
        opt.step()
        opt.zero_grad()

    step()
    with tb.recording() as rec:
        for _ in range(steps):
            step()
    return rec.trace


def test_a_compiled_training_step_is_recorded_as_a_forward_and_a_backward_program() -> None:
    from tpusim.trace.records import OpRecord

    trace = _mlp_steps(compiled=True)
    ops = [r for r in trace.records if isinstance(r, OpRecord)]
    numbers = [r.program for r in ops if r.program]
    assert sorted(set(numbers)) == [1, 2, 3, 4]                  # forward + backward, two steps
    assert all(a <= b for a, b in zip(numbers, numbers[1:]))     # each execution's ops are contiguous
    # The MXU work is the model's, in closed form: per step 5 matmuls of 2*64*256*1024 FLOPs (2 forward,
    # 2 weight gradients, 1 input gradient of the second layer) plus the forward bias adds (addmm).
    mxu = sum(r.flops for r in ops if r.program and r.unit == "mxu")
    assert mxu == 2 * (5 * 2 * 64 * 256 * 1024 + 64 * 1024 + 64 * 256)
    assert {r.source for r in ops if r.program} == {f"test_compile.py:{_mlp_steps.__code__.co_firstlineno + 9}"}


def test_the_compiled_program_prices_below_the_same_model_run_eagerly() -> None:
    from tpusim.eager.modes import get_mode
    from tpusim.pricing import price
    from tpusim.slice.topology import build_slice

    def steady_step(trace: object, mode: str) -> float:
        return price(trace, topology=build_slice("3d:1x1x1", chip="v5p"), mode=get_mode(mode)).steps[-1].seconds

    compiled, eager = _mlp_steps(compiled=True), _mlp_steps(compiled=False)
    for mode in ("debug", "strict"):    # one launch per graph and whole-graph fusion against one launch per op
        assert steady_step(compiled, mode) < steady_step(eager, mode)
    timeline = price(compiled, topology=build_slice("3d:1x1x1", chip="v5p"), mode=get_mode("strict"))
    fusion = timeline.meta["fusion"]
    assert fusion.programs == 4 and fusion.program_kernels < fusion.program_ops
    eager_run = price(eager, topology=build_slice("3d:1x1x1", chip="v5p"), mode=get_mode("strict"))
    # the forward and backward graphs compile once each, where eager compiles every distinct op
    assert timeline.meta["compile_cache"].misses < eager_run.meta["compile_cache"].misses


def test_graph_breaks_and_recompiles_reach_the_trace_and_the_lint() -> None:
    from tpusim.hardware.spec import load_chip
    from tpusim.report.lint import lint

    compiled = torch.compile(_branchy, backend="tpu", dynamic=False)
    with tb.recording() as rec:
        compiled(torch.randn(8, device="tpu"))
        compiled(torch.randn(16, device="tpu"))        # a new shape: Dynamo recompiles
    facts = rec.trace.meta.torch_compile
    assert facts.graphs >= 2 and facts.graph_breaks and facts.recompiles
    codes = {w.code: w for w in lint(rec.trace, load_chip("v5p"))}
    assert "test_compile.py" in codes["graph-break"].source and "dynamo-recompile" in codes
    programs = {r.program for r in rec.trace.records if getattr(r, "program", 0)}
    assert len(programs) >= 4       # two graphs (before and after the break) per call


def test_a_program_without_torch_compile_has_no_compile_facts() -> None:
    with tb.recording() as rec:
        torch.randn(4, device="tpu").sin()
    assert rec.trace.meta.torch_compile is None


def test_tpusim_run_prices_a_compiled_model_in_shape_only_mode(tmp_path: object) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", "examples/transformer.py", "--numerics", "off",
                           "--quiet", "--out", str(tmp_path), "--", "--compile", "--steps", "2", "--layers", "1",
                           "--d-model", "64", "--seq", "32"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["complete"]
    fusion = report["modes"]["strict"]["fusion"]
    assert fusion["programs"] == 4 and 0 < fusion["program_kernels"] < fusion["program_ops"]


def test_an_output_that_views_an_intermediate_is_written_where_its_readers_read() -> None:
    # The graph returns y.t(), a view of y, which is not itself an output: the op that computes y writes
    # the returned tensor's storage, so the eager op after the program reads what the program wrote.
    from tpusim.trace.records import OpRecord

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).t()

    compiled = torch.compile(f, backend="tpu")
    x = torch.randn(8, 16)
    compiled(x.to("tpu"))                                        # compile outside the recording
    with tb.recording() as rec:
        got = compiled(x.to("tpu"))
        after = got.exp()
    torch.testing.assert_close(after.cpu(), f(x).exp())
    ops = [r for r in rec.trace.records if isinstance(r, OpRecord)]
    written = {t.storage for r in ops if r.program for t in r.outputs}
    (reader,) = [r for r in ops if not r.program and r.op.startswith("aten::exp")]
    assert reader.inputs[0].storage in written
