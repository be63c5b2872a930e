"""The lint rows that tell a tpusim user what fails or is slow on TorchTPU (issue 29 items 4 and 6): ops TorchTPU
does not lower (its table, counted from its source by tools/torchtpu_ops.py), attention that misses its flash
kernel, torch.compile under inference_mode, and the named causes of recompiles. Each rule fires on a program
with the pitfall and stays quiet on the same program without it. Traces are built here, in-process."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from factories import A, B, C

from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.report import torchtpu
from tpusim.report.lint import RULES, lint
from tpusim.report.schema import Report
from tpusim.slice.topology import build_slice
from tpusim.testing.budgets import Budgets, evaluate, parse_lint_list
from tpusim.trace.records import (
    DynamoRecompile,
    OpRecord,
    StepMarker,
    TensorMeta,
    Trace,
    TraceMeta,
    renumber,
)

STRICT = get_mode("strict")

CHIP = build_slice("3d:1x1x1", "v5p").chip
ROOT = Path(__file__).resolve().parent.parent
NEW_CODES = ("torchtpu-op", "attention-path", "compile-inference-mode")


def op(name: str, source: str, inputs: tuple[TensorMeta, ...] = (A,), dtype: str = "bfloat16") -> OpRecord:
    return OpRecord(0, name, "vpu", dtype, inputs, (C,), source=source)


def codes(trace: Trace, code: str, timeline: object = None) -> list:
    return [w for w in lint(trace, CHIP, timeline) if w.code == code]


# ---- the op table, as data counted from TorchTPU's source ---------------------------------------------------

def test_the_table_says_where_it_was_counted_and_holds_what_it_counts() -> None:
    overloads = torchtpu.lowered_overloads()
    header = (ROOT / "tpusim/report/data/torchtpu_ops.txt").read_text()
    assert f"# {len(overloads)} overloads of {len({o.split('.')[0] for o in overloads})} ops." in header
    assert len(overloads) == 629                                 # counted at 6773940b
    assert "6773940b2e790af75d09cf5188ffce00e71c916b" in torchtpu.ops_source()
    assert {"add.out", "_ctc_loss", "linalg_lu.out", "_unique2", "max_pool2d"} <= overloads   # max_pool2d: Autograd key
    assert not any(o.startswith(("linalg_cholesky", "unique_dim.")) or o == "unique_dim" for o in overloads)


def test_the_generator_reads_registrations_and_spellings(tmp_path: Path) -> None:
    # A checkout in the shape of TorchTPU's: one block per dispatch key, OpName spellings in a switch.
    (tmp_path / "torch_tpu/csrc/eager").mkdir(parents=True)
    (tmp_path / "torch_tpu/csrc/ops").mkdir(parents=True)
    (tmp_path / "torch_tpu/csrc/eager/tpu_aten_kernels.cc").write_text(
        "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {\n  ImplStable<OpName::kAddOut>(m, AtenAddOut);\n"
        "  ImplStable<OpName::kMmOut>(\n      m, AtenMmOut);\n}\n"
        "TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {\n  ImplStable<OpName::kMaxPool2d>(m, F);\n}\n"
        "TORCH_LIBRARY_IMPL(tpu, PrivateUse1, m) {\n  ImplExperimental<OpName::kRaggedDot>(m, G);\n}\n")
    (tmp_path / "torch_tpu/csrc/ops/op_names.cc").write_text(
        'case OpName::kAddOut:\n  return "add.out";\ncase OpName::kMmOut:\n  // a comment\n  return "mm.out";\n'
        'case OpName::kMaxPool2d:\n  return "max_pool2d";\ncase OpName::kRaggedDot:\n  return "ragged_dot";\n')
    out = tmp_path / "ops.txt"
    done = subprocess.run([sys.executable, str(ROOT / "tools/torchtpu_ops.py"), str(tmp_path), "--commit", "abc",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert [line for line in text.splitlines() if not line.startswith("#")] == ["add.out", "max_pool2d", "mm.out"]
    assert "at commit abc" in text and "# 3 overloads of 3 ops." in text     # tpu:: custom ops are not ATen's


@pytest.mark.parametrize(("recorded", "lowered"), [
    ("aten::linalg_cholesky_ex", False),       # Hugging Face's gap: no linalg_cholesky* row in the table
    ("aten::unique_dim", False),               # torch.unique(dim=...): unique_dim_consecutive and _unique2 only
    ("aten::_unique2", True),                  # torch.unique without dim
    ("aten::_ctc_loss", True),                 # lowered at 6773940b (ctc_loss, _ctc_loss and their backwards)
    ("aten::_ctc_loss_backward", True),
    ("aten::avg_pool2d_backward", True),       # avg_pool1d's backward: avg_pool2d_backward.grad_input is lowered
    ("aten::index", True),                     # boolean-mask indexing: nonzero + index.Tensor_out, both lowered
    ("aten::nonzero", True),
    ("aten::add", True), ("aten::add_", True),  # structured: functional and in-place reach add.out
    ("aten::convolution_overrideable", True),  # tpusim's name for what reaches TorchTPU's convolution
    ("aten::native_group_norm", True),         # PyTorch's composite kernel decomposes it on TorchTPU
    ("tpusim::attention", True),               # not an ATen op: not the table's
])
def test_known_gaps_against_the_table(recorded: str, lowered: bool) -> None:
    assert torchtpu.lowers(recorded) is lowered


def test_an_unlowered_op_is_named_once_at_its_first_line() -> None:
    program = [op("aten::mm", "m.py:1"), op("aten::linalg_cholesky_ex", "m.py:7"), op("aten::add", "m.py:8"),
               op("aten::linalg_cholesky_ex", "m.py:9"), op("aten::unique_dim", "m.py:12")]
    found = codes(Trace(renumber(program)), "torchtpu-op")
    assert [(w.source, w.message.split(" has ")[0]) for w in found] == [
        ("m.py:7", "aten::linalg_cholesky_ex (2x)"), ("m.py:12", "aten::unique_dim (1x)")]
    assert "on TorchTPU this op fails (NotImplementedError), or falls back to the host" in found[0].message
    without = [r for r in program if r.op not in ("aten::linalg_cholesky_ex", "aten::unique_dim")]
    assert codes(Trace(renumber(without)), "torchtpu-op") == []



def test_an_op_inside_a_compiled_graph_is_the_compilers() -> None:
    """Issue 45: a torch.compile'd graph goes to the compiler, so its ops are never judged by the eager table."""
    graph = [dataclasses.replace(op(name, "m.py:3"), program=1) for name in ("aten::embedding", "aten::clone")]
    eager = [op("aten::embedding", "m.py:5"), op("aten::unique_dim", "m.py:6")]
    assert not torchtpu.lowers("aten::embedding") and not torchtpu.lowers("aten::clone")
    assert codes(Trace(renumber(graph)), "torchtpu-op") == []
    found = codes(Trace(renumber(graph + eager)), "torchtpu-op")
    assert [(w.source, w.message.split(" has ")[0]) for w in found] == [
        ("m.py:5", "aten::embedding (1x)"), ("m.py:6", "aten::unique_dim (1x)")]

# ---- attention that misses the flash kernel ----------------------------------------------------------------

def attention(head: int, dtype: str = "bfloat16", rank: int = 4) -> Trace:
    shape = (2, 8, 256, head)[4 - rank:]
    q = TensorMeta(1, shape, dtype, 2 * 8 * 256 * head * 2, 1)
    sdpa = op("aten::_scaled_dot_product_fused_attention_overrideable", "attn.py:20", (q, q, q), dtype)
    return Trace(renumber([sdpa]))


def test_attention_off_the_flash_kernel_says_which_condition() -> None:
    (head,) = codes(attention(192), "attention-path")
    assert head.source == "attn.py:20"
    assert "head dim 192 (the kernel takes one below 128 or a multiple of it)" in head.message
    (dtype,) = codes(attention(64, "float16"), "attention-path")
    assert "dtype float16 (the kernel takes float32 or bfloat16)" in dtype.message
    (rank,) = codes(attention(64, rank=3), "attention-path")
    assert "query of rank 3" in rank.message
    for fine in (attention(64), attention(128), attention(256, "float32")):     # below 128, or a multiple of it
        assert codes(fine, "attention-path") == []


def test_compiled_attention_is_checked_too() -> None:
    q = TensorMeta(1, (1, 4, 128, 160), "bfloat16", 1, 1)
    trace = Trace(renumber([dataclasses.replace(op("tpusim::attention", "g.py:3", (q, q, q)), program=1)]))
    assert [w.source for w in codes(trace, "attention-path")] == ["g.py:3"]


# ---- torch.compile under inference_mode ----------------------------------------------------------------------

def test_compile_under_inference_mode_is_named_at_its_line() -> None:
    compiled = Trace(renumber([op("aten::mm", "m.py:1")]), meta={"torch_compile": {"graphs": 1}})
    assert codes(compiled, "compile-inference-mode") == []
    meta = compiled.meta.replace(inference_mode_compiles=("serve.py:14",))
    (found,) = codes(dataclasses.replace(compiled, meta=meta), "compile-inference-mode")
    assert found.source == "serve.py:14" and "use torch.no_grad() instead" in found.message
    assert TraceMeta.from_dict(meta.to_dict()) == meta          # the new fact survives the trace file
    assert "inference_mode_compiles" not in compiled.meta.to_dict()     # unset: absent, as old traces have it


# ---- recompiles: the causes named ------------------------------------------------------------------------------

def loop_with_batches(rows: list[int]) -> Trace:
    """One mm a step over batches of ``rows`` rows at train.py:9."""
    records = []
    for step, n in enumerate(rows):
        x = TensorMeta(1, (n, 128), "bfloat16", n * 256, 1)
        records += [OpRecord(0, "aten::mm", "mxu", "bfloat16", (x, B), (C,), source="train.py:9"), StepMarker(0, step)]
    return Trace(renumber(records))


def test_a_short_last_batch_is_named_and_a_varying_batch_is_not() -> None:
    short_last = loop_with_batches([64, 64, 64, 37])
    timeline = price(short_last, topology=build_slice("3d:1x1x1", "v5p"), mode=get_mode("strict"))
    assert timeline.meta["compile_cache"].recompiles       # the compile cache's own finding, not built here
    (found,) = codes(short_last, "recompile", timeline)
    assert found.source == "train.py:9"
    assert "in the last step only: a short last batch (64 -> 37 rows)" in found.message
    assert "drop_last=True" in found.message
    varying = loop_with_batches([64, 37, 64, 64])           # the short batch mid-loop: shapes vary, not a last batch
    (other,) = codes(varying, "recompile", price(varying, topology=build_slice("3d:1x1x1", "v5p"), mode=STRICT))
    assert "last batch" not in other.message and "pad or bucket" in other.message
    steady = loop_with_batches([64, 64, 64, 64])
    assert codes(steady, "recompile", price(steady, topology=build_slice("3d:1x1x1", "v5p"), mode=STRICT)) == []


def test_a_recompile_of_a_shorter_last_batch_needs_the_same_rest_of_the_shape() -> None:
    from tpusim.report.lint import _shorter_batch

    assert _shorter_batch(((64, 128),), ((37, 128),)) and not _shorter_batch(((64, 128),), ((64, 96),))
    assert not _shorter_batch(((64, 128),), ((37, 96),)) and not _shorter_batch(((37, 128),), ((64, 128),))


def compiled(*recompiles: DynamoRecompile) -> Trace:
    return Trace(renumber([op("aten::mm", "m.py:1")]), meta={"torch_compile": {"graphs": 2, "recompiles": [
        {"function": r.function, "reason": r.reason} for r in recompiles]}})


def test_a_python_number_guarded_by_value_is_named_as_the_cause() -> None:
    lr = DynamoRecompile("step (/home/u/train.py:40)", "0/0: L['lr'] == 0.01   # p.add_(g, alpha=-lr)  # train.py:44 "
                         "in step\nUser stack trace:\n  File \"/home/u/train.py\", line 44, in step\n    p.add_(g)")
    (found,) = codes(compiled(lr), "dynamo-recompile")
    assert found.source == "train.py:44"
    assert "L['lr'] == 0.01: a Python number that changes between calls is a constant" in found.message
    assert "pass it as a tensor" in found.message
    size = DynamoRecompile("f (/home/u/m.py:4)", "0/1: tensor 'x' size mismatch at index 0. expected 8, actual 5")
    (shape,) = codes(compiled(size), "dynamo-recompile")
    assert shape.source == "m.py:4" and "a tensor's size changed (at index 0, the batch" in shape.message
    assert "Python number" not in shape.message
    other = DynamoRecompile("f (/home/u/m.py:4)", "0/0: ___check_type_id(L['x'], 9)")
    (plain,) = codes(compiled(other), "dynamo-recompile")
    assert plain.message.endswith("___check_type_id(L['x'], 9)")


# ---- tpusim check --fail-on ------------------------------------------------------------------------------------

def test_check_fails_on_each_new_code_with_its_source_line() -> None:
    assert parse_lint_list(",".join(NEW_CODES)) == NEW_CODES and all(code in RULES for code in NEW_CODES)
    report = Report.model_validate({
        "schema": "tpusim-report", "version": 3, "complete": True, "error": None, "exit_code": 0,
        "run": {"script": "t.py", "topology": "3d:1x1x1", "chip": "v5p", "argv": [], "numerics": "on",
                "torch_version": "", "modes": []},
        "chip": {"hbm_bytes": 1, "name": "v5p", "display_name": "TPU v5p", "peak_bf16_flops_per_s": 1.0,
                 "hbm_bytes_per_s": 1.0},
        "slice": {"chips": 1, "dims": [1, 1, 1]},
        "program": {"ops": 1, "collectives": 0, "syncs": 0, "steps": 1, "model_flops": 0.0}, "modes": {},
        "warnings": [{"code": "torchtpu-op", "message": "aten::unique_dim (1x) has no TorchTPU lowering",
                      "source": "t.py:5"}]})
    checks = {c.name: c for c in evaluate(report, Budgets(fail_on=NEW_CODES))}
    assert not checks["lint[torchtpu-op]"].passed and "t.py:5: aten::unique_dim" in checks["lint[torchtpu-op]"].message
    assert checks["lint[attention-path]"].passed and checks["lint[compile-inference-mode]"].passed


@pytest.mark.slow
def test_tpusim_check_fails_on_an_unlowered_op_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "gaps.py").write_text('import torch\na = torch.randn(4, 4, device="tpu")\n'
                                      'spd = a @ a.T + 4 * torch.eye(4, device="tpu")\ntorch.linalg.cholesky(spd)\n')
    done = subprocess.run([sys.executable, "-m", "tpusim", "check", "gaps.py", "--compiler", "model",
                           "--fail-on", "torchtpu-op", "--out", "out"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1, done.stderr
    assert "FAIL lint[torchtpu-op]: 1 torchtpu-op finding(s): gaps.py:4: aten::linalg_cholesky_ex (1x)" in done.stdout


@pytest.mark.slow
def test_tpusim_check_passes_a_compiled_model_whose_graph_has_ops_the_eager_table_lacks(tmp_path: Path) -> None:
    """Issue 45: turning on torch.compile never fails ``check --fail-on torchtpu-op`` for the graph's ops."""
    (tmp_path / "compiled.py").write_text(
        "import torch\nfrom torch import nn\nmodel = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 4)).to('tpu')\n"
        "step = torch.compile(model)\nfor _ in range(2):\n"
        "    step(torch.tensor([[1, 2, 3]], device='tpu')).sum().backward()\n")
    done = subprocess.run([sys.executable, "-m", "tpusim", "check", "compiled.py", "--compiler", "model",
                           "--fail-on", "torchtpu-op", "--out", "out"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS lint[torchtpu-op]" in done.stdout
