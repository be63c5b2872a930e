"""Cases through the product path: each published run as a PyTorch script, recorded by `tpusim run`, then priced.

Why: the number users act on is what `tpusim run my_model.py` prints, so that is what is checked against
real TPUs. Each case here runs ``validation/decoder.py`` (a torchtitan-style decoder: FSDP2, tensor and
sequence parallel through DTensor, activation checkpointing as the published remat policy, per-block
``torch.compile``, int8 projections where the run quantised) with the published model, batch and slice, as
``python -m tpusim run validation/decoder.py --numerics off --ranks one`` in a process of its own, and
prices the recorded program (``program.jsonl``) on the chip it is handed (calibrated, or perturbed by
``--explain`` and ``--fit``) with ``tpusim.pricing.price``, the function `tpusim run` prices with. The step
is the last of three (``STEPS``): the first compiles the model and creates AdamW's state, the second compiles
the optimizer's steady update (its Fused eager clusters differ from the first step's, which created the state),
the third is the steady step a published step time measures.

Published XLA/MaxText step times are whole compiled programs, so the cases compare them with the script
under ``torch.compile`` (``mode`` "compile"): the blocks are compiled, the embedding, loss and optimizer run
in Fused eager around them.

The sources are MaxText's published tables (the Decoder and Run rows of ``tpusim/validate/maxtext.py``, no
data-parallel axis; the 2- and 4-slice v5e rows with `tpusim run --slices` and the script's ``--dcn``: FSDP
inside each slice, the gradient shards all-reduced over DCN) and the AI-Hypercomputer/tpu-recipes Trillium
(v6e) training recipes' step-time log lines (``RECIPES``). Not run here, with why: multi-slice rows of more
than 4 slices (minutes apiece; they stay closed-form cases), MLPerf blocks (they include eval passes), the 2023
v4 rows (MaxText had no flash kernel then; the script's attention is one), and the dropless (megablox)
mixture-of-experts recipes (``validation/moe_decoder.py`` has MaxText's dense dropping MoE only).

HBM: the recording runs with the capacity check off (``TPUSIM_HBM_BYTES=0``). What a PyTorch translation
keeps for the backward pass (a row-parallel matmul's partial sums, activations a recipe offloads to host
memory) is not what XLA's program keeps, and a case must not stop on that artefact; the peak the
translation needed is reported beside the prediction (``--explain``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpusim.eager.compiled import MODEL_ONLY
from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec
from tpusim.output import cache_dir
from tpusim.validate.case import Case, Prediction
from tpusim.validate.maxtext import RUNS, Run, has_product_twin

VALIDATION = Path(__file__).resolve().parents[2] / "validation"      # the cases' PyTorch scripts
RECORD_TIMEOUT_S = 1800
STEPS = 3                           # training steps a case records; the last is priced (module docstring)
RECIPES_REPO = "https://github.com/AI-Hypercomputer/tpu-recipes"

# MaxText remat policies -> the script's --remat (validation/decoder.py's docstring)
REMAT = {"minimal": "dots", "save_dot_except_logits": "dots", "save_dot_except_mlpwi": "dots", "full": "full",
         "offload": "qkv"}


@dataclass(frozen=True)
class ProductRun:
    """One published run as the script's command line, with its published step time and source."""

    name: str
    family: str                     # model family: leave-one-family-out drops all of a family's cases at once
    chip: str
    topology: str
    accelerator: str
    args: tuple[str, ...]           # validation/decoder.py's arguments
    published_s: float
    published: str
    source: str
    where: str
    setup: str
    conversion: str = ""
    slow: bool = True
    twin: str = ""                  # the closed-form case of the same published figure (tpusim/validate/maxtext.py)
    script: str = "decoder.py"      # the PyTorch script in validation/ (decode.py: the inference cases)
    mode: str = "compile"           # how the published run ran: "compile" (compiled blocks), "fused", "strict"
    eager: str = "fused"            # the eager mode of what is not compiled: `tpusim run --mode` (TorchTPU's)
    compiler: str = "model"         # who builds the compiled programs priced: tpusim's model, or XLA (`--compiler`)
    slices: int = 1                 # copies of the topology joined over DCN (`tpusim run --slices`)


def _decoder_args(layers: int, emb: int, heads: int, head_dim: int, mlp_dim: int, vocab: int, seq: int, *,
                  kv_heads: int = 0, mlp: str = "swiglu", norm: str = "rms", positions: str = "rope",
                  attention: str = "causal", batch: int, tp: int = 1, remat: str,
                  int8: bool = False, dcn: int = 1) -> tuple[str, ...]:
    args = ["--layers", layers, "--d-model", emb, "--heads", heads, "--kv-heads", kv_heads or heads,
            "--head-dim", head_dim, "--mlp-dim", mlp_dim, "--vocab", vocab, "--seq", seq, "--mlp", mlp,
            "--norm", norm, "--positions", positions, "--attention", attention, "--batch", batch, "--tp", tp,
            "--remat", remat, "--steps", STEPS] + (["--dcn", dcn] if dcn > 1 else [])
    return tuple(map(str, args)) + (("--int8",) if int8 else ())


def from_maxtext(run: Run) -> ProductRun:
    """A MaxText table row (tpusim/validate/maxtext.py) as the script's arguments, with its published time."""
    m = run.model
    args = _decoder_args(m.layers, m.emb, m.heads, m.head_dim, m.mlp, m.vocab, m.seq,
                         mlp="swiglu" if m.mlp_matrices_in == 2 else "relu",
                         attention="masked" if m.attention_kept == 1.0 else "causal", batch=run.per_device_batch,
                         tp=run.tensor, remat=REMAT[run.remat], int8=m.quantized, dcn=run.slices)
    dcn = f", data parallel over {run.slices} slices (HSDP over DCN)" if run.slices > 1 else ""
    return ProductRun(
        name=f"product-{run.name}", family=f"maxtext-{run.chip}", chip=run.chip, topology=run.topology,
        slices=run.slices, accelerator=run.accelerator, args=args, published_s=run.published_step_s(),
        published=f"{run.tflops_per_chip:g} TFLOP/s/chip ({run.mfu} MFU)", source=run.source,
        where=f"{run.where}; config {run.config}",
        setup=f"{run.model_label} ({m.params / 1e9:.1f}B), fsdp x tensor {run.tensor}{dcn}; per-device batch "
              f"{run.per_device_batch} x seq {m.seq}; remat {run.remat}",
        conversion=f"step = MaxText's TFLOPs per device per step ({m.maxtext_tflops(run.per_device_batch):.1f}) / "
                   f"{run.tflops_per_chip:g} TFLOP/s", twin=run.name)


def _recipe(name: str, family: str, topology: str, accelerator: str, args: tuple[str, ...], step_s: float,
            line: str, path: str, commit: str, setup: str) -> ProductRun:
    return ProductRun(name=f"product-recipes-{name}", family=family, chip="v6e", topology=topology,
                      accelerator=accelerator, args=args, published_s=step_s, published=f"{step_s:g} s per step",
                      source=RECIPES_REPO, where=f"{path} @ {commit[:10]}: \"{line}\"", setup=setup,
                      slow=name != "mistral-7b-v6e-8")


# Trillium (v6e) recipes of AI-Hypercomputer/tpu-recipes: MaxText model configs (MaxText/configs/models/*.yml)
# and each recipe's published log line; pure FSDP over the slice (ici_fsdp_parallelism=-1). Their remat
# policies offload the layer input and the q/k/v projections to host memory and recompute the rest: the
# script keeps q/k/v ("qkv") and recomputes the rest, the same TensorCore work.
_LLAMA31_70B = dict(layers=80, emb=8192, heads=64, head_dim=128, mlp_dim=28672, vocab=128256, kv_heads=8)
_T70 = "training/trillium/Llama3.1-70B-MaxText"


def _llama31_70b(chips: int, topology: str, batch: int, step: int, step_s: float, tflops: str,
                 note: str = "") -> ProductRun:
    """One size of the Llama 3.1 70B recipe (its README @ 3596002a for each slice)."""
    return _recipe(f"llama3.1-70b-v6e-{chips}", "llama3.1-70b", topology, f"v6e-{chips}",
                   _decoder_args(**_LLAMA31_70B, seq=8192, batch=batch, remat="qkv"), step_s,
                   f"completed step: {step}, seconds: {step_s:.3f}, TFLOP/s/device: {tflops}",
                   f"{_T70}/v6e-{chips}/README.md", "3596002ad03c04ae20d5f04c711e8a1d2557b7f8",
                   f"Llama 3.1 70B, fsdp {chips}; per-device batch {batch} x seq 8192; "
                   f"remat offload (decoder_layer_input, q/k/v_proj){note}")


RECIPES: tuple[ProductRun, ...] = (
    _llama31_70b(256, "2d:16x16", 5, 14, 42.656, "462.297"),
    _llama31_70b(128, "2d:8x16", 4, 14, 34.786, "453.500"),
    _llama31_70b(64, "2d:8x8", 2, 14, 18.688, "422.091"),
    _llama31_70b(32, "2d:4x8", 2, 34, 17.790, "443.385", note="; collective matmul off"),
    _recipe("llama2-70b-v6e-256", "llama2-70b", "2d:16x16", "v6e-256",
            _decoder_args(80, 8192, 64, 128, 28672, 32000, 4096, kv_heads=8, batch=2, remat="qkv"), 9.052,
            "completed step: 16, seconds: 9.052, TFLOP/s/device: 402.274, Tokens/s/device: 905.021, "
            "total_weights: 2097152", "training/trillium/Llama2-70B-MaxText/README.md",
            "9e458c71883a862cb3ba0cd466a223b8a9cba426", "Llama 2 70B, fsdp 256; per-device batch 2 x seq 4096 "
            "(the config says 3; the log's total_weights 2097152 = 256 x 2 x 4096 and 905 tokens/s x 9.052 s say 2); "
            "remat qkv_proj_offloaded"),
    _recipe("mistral-7b-v6e-8", "mistral-7b", "2d:2x4", "v6e-8",
            _decoder_args(32, 4096, 32, 128, 14336, 32000, 8192, kv_heads=8, batch=6, remat="qkv"), 6.320,
            "completed step: 6, seconds: 6.320, TFLOP/s/device: 431.981",
            "training/trillium/Mistral-7B-MaxText/README.md",
            "7f2f5e62e140401c1c2acf56dbc21cecf80512bd", "Mistral 7B, fsdp 8; per-device batch 6 x seq 8192; "
            "remat offload (decoder_layer_input, out_proj, q/k/v_proj)"),
    _recipe("gpt3-175b-int8-v6e-256", "gpt3-175b", "2d:16x16", "v6e-256",
            _decoder_args(96, 12288, 96, 128, 49152, 50304, 2048, mlp="gelu", norm="layer", positions="learned",
                          batch=3, remat="full", int8=True), 14.245,
            "step: 100, seconds: 14.245, TFLOP/s/device: 464.261", "training/trillium/GPT3-175B-MaxText/fp8/README.md",
            "48e590c6b499e27913245d9cd5c52b36827e3b94",
            "GPT-3 175B, fsdp 256; per-device batch 3 x seq 2048; remat full; int8 AQT projections (the folder is "
            "named fp8; its run_recipe.sh says the config sets quantization=int8)"),
    dataclasses.replace(_recipe(
        "mixtral-8x7b-dropped-v6e-256", "mixtral-8x7b", "2d:16x16", "v6e-256",
        tuple(map(str, ("--layers", 32, "--d-model", 4096, "--heads", 32, "--kv-heads", 8, "--head-dim", 128,
                        "--mlp-dim", 14336, "--vocab", 32000, "--seq", 4096, "--experts", 8, "--top-k", 2,
                        "--capacity-factor", 1.25, "--dispatch", "einsum", "--batch", 12, "--remat", "attention",
                        "--steps", STEPS))), 13.484,
        "completed step: 11, seconds: 13.484, TFLOP/s/device: 302.311, Tokens/s/device: 3645.203, "
        "total_weights: 12582912, loss: 10.546", "training/trillium/Mixtral-8x7B-MaxText/README.md", "44189f9",
        "Mixtral 8x7B (mixtral_8x7b_dropped), fsdp 256; per-device batch 12 x seq 4096; 8 experts top-2, dense "
        "dropping MoE (megablox off, sparse_matmul off), capacity factor 1.25: MaxText's one-hot einsum dispatch "
        "and combine (--dispatch einsum); remat offload (decoder_layer_input, out_proj, q/k/v_proj)"),
        script="moe_decoder.py"),
)

MAXTEXT_RUNS = tuple(from_maxtext(run) for run in RUNS if has_product_twin(run))
PRODUCT_RUNS: tuple[ProductRun, ...] = (*MAXTEXT_RUNS, *RECIPES)


# --------------------------------------------------------------------------- recording and pricing

def command(run: ProductRun, out: Path) -> list[str]:
    """The `tpusim run` command line a case records with (what a user would type, plus --out)."""
    return [sys.executable, "-m", "tpusim", "run", str(VALIDATION / run.script), "--topology", run.topology,
            "--slices", str(run.slices), "--chip", run.chip, "--mode", run.eager, "--numerics", "off",
            "--ranks", "one", "--compiler", run.compiler, "--quiet", "--out", str(out), "--", *run.args]


@functools.cache
def source_digest() -> str:
    """What a recording depends on: tpusim's code (Python and the C++ shim; not this package, which `tpusim run`
    never runs), the script and the chip files (not the calibrations: a case prices the recorded program on
    the chip it is handed). A recording kept under another digest is never reused."""
    root = VALIDATION.parent
    code = [path for path in (root / "tpusim").rglob("*.py") if "validate" not in path.relative_to(root).parts]
    files = sorted([*code, *(root / "tpusim" / "backend" / "csrc").glob("*.*"), *(root / "topologies").glob("*.toml"),
                    *(root / "topologies" / "chips").glob("*.toml"), *VALIDATION.glob("*.py")])
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cached_folder(run: ProductRun) -> Path:
    """The recording's folder in tpusim's cache: one per command line and source digest."""
    words = [source_digest(), run.script, run.chip, run.topology, run.compiler, *run.args] + \
        ([f"slices={run.slices}"] if run.slices > 1 else [])
    key = hashlib.sha256("\0".join(words).encode()).hexdigest()
    return cache_dir("validate") / f"{run.name}-{key[:16]}"


@functools.cache
def recording(run: ProductRun) -> tuple[object, dict]:
    """The program trace and report.json `tpusim run` wrote for ``run``: recorded once per source digest
    (kept in tpusim's cache, ~/.cache/tpusim/validate), then read back. A cached recording that cannot be read
    back whole (cut short, ``null``, a folder where a file was) is recorded again and replaced; a cache that
    cannot be written is said in one line, and the case is recorded in a temporary folder."""
    if not (VALIDATION / run.script).is_file():
        raise TpusimError(f"{VALIDATION / run.script}: the validation script is missing (it ships in the repository, "
                          f"next to tpusim/; run `tpusim validate` from a clone)")
    folder = cached_folder(run)
    return _read_back(folder, run.eager) or _record(run, folder)


def _read_back(folder: Path, mode: str) -> tuple[object, dict] | None:
    """The recording in ``folder`` (its program, whole and of a version read here, and its report.json, whole JSON
    with the eager ``mode`` a case reads), or None when there is none or it is damaged."""
    from tpusim.trace.records import read_trace

    program, report_file = folder / "program.jsonl", folder / "report.json"
    if not (program.is_file() and report_file.is_file()):     # never a FIFO (a read would block) or a folder
        return None
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
        modes = report.get("modes") if isinstance(report, dict) else None
        if not (isinstance(modes, dict) and isinstance(modes.get(mode), dict)):
            return None
        return read_trace(program), report
    except (TpusimError, OSError, ValueError, RecursionError):
        return None


_NOT_KEPT: list[str] = []                   # the cache folder this process could not write (said once)


def _scratch(run: ProductRun, cache: Path) -> tuple[Path, bool]:
    """A fresh scratch folder beside the cache (True: the recording can be kept), or, when the cache cannot be
    written (read-only, or a file where a folder must be), in the temporary folder (False), said once."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{run.name}-", dir=cache)), True
    except OSError as error:
        if not _NOT_KEPT:
            _NOT_KEPT.append(str(cache))
            print(f"tpusim validate: cannot write the recordings' cache {str(cache)!r} "
                  f"({error.strerror or type(error).__name__}); recording in a temporary folder, not kept "
                  f"(set XDG_CACHE_HOME to a folder that can be written to keep them)", file=sys.stderr)
        return Path(tempfile.mkdtemp(prefix=f"tpusim-validate-{run.name}-")), False


def _record(run: ProductRun, folder: Path) -> tuple[object, dict]:
    """Run the case's `tpusim run` into a scratch folder, read it back, and move it into the cache whole (never
    half), in place of a damaged entry."""
    scratch, keep = _scratch(run, folder.parent)
    out = scratch / "run"
    env = {**os.environ, "TPUSIM_HBM_BYTES": "0"}      # the module docstring: HBM
    try:
        done = subprocess.run(command(run, out), env=env, capture_output=True, text=True, timeout=RECORD_TIMEOUT_S)
        if done.returncode != 0 or not (out / "report.json").is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise TpusimError(f"case {run.name}: `tpusim run` failed (exit {done.returncode}): {' | '.join(tail)}")
        found = _read_back(out, run.eager)
        if found is None:
            raise TpusimError(f"case {run.name}: `tpusim run` wrote a recording that cannot be read back")
        if keep:
            _replace(out, folder)
        return found
    except subprocess.TimeoutExpired:
        raise TpusimError(f"case {run.name}: `tpusim run` took over {RECORD_TIMEOUT_S} s") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _replace(new: Path, folder: Path) -> None:
    """``new`` renamed to ``folder``; a damaged entry there is moved aside first and removed."""
    with contextlib.suppress(OSError):
        if os.path.lexists(folder):
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}-damaged-", dir=folder.parent))
            folder.rename(aside / "entry")
            shutil.rmtree(aside, ignore_errors=True)
    with contextlib.suppress(OSError):               # another process may have kept the same recording first
        new.rename(folder)


def predictor(run: ProductRun):
    def predict(chip: ChipSpec) -> Prediction:
        from tpusim.eager.modes import get_mode
        from tpusim.pricing import price
        from tpusim.pricing.compiled import ask_compiler, compiler_output
        from tpusim.slice.topology import build_slice

        trace, report = recording(run)
        built = compiler_output(ask_compiler(trace, chip, run.compiler)) if run.compiler == "xla" else MODEL_ONLY
        timeline = price(trace, topology=build_slice(run.topology, chip=chip, slices=run.slices),
                         mode=get_mode(run.eager), compiled=built)
        step = timeline.steps[-1]
        mode = report["modes"][run.eager]
        hbm = mode.get("hbm", {}).get("peak_bytes") or 0
        ran = ("the blocks torch.compile'd, the rest" if run.mode == "compile" else "the whole step") + \
            f" in {run.eager.capitalize()} eager"
        notes = (f"validation/{run.script} {' '.join(run.args)}",
                 f"{run.accelerator} = {run.topology}{f' x {run.slices} slices' if run.slices > 1 else ''}; {ran}; "
                 f"the last of {STEPS} steps",
                 f"HBM the PyTorch translation kept: {hbm / 2**30:.1f} GiB of the chip's "
                 f"{chip.hbm_bytes / 2**30:.0f} GiB")
        return Prediction(step.seconds, {"step": step.seconds}, notes)

    return predict


RUNS_BY_CASE: dict[str, ProductRun] = {}      # every training case's run, by case name (``with_compiler``)


def case(run: ProductRun) -> Case:
    RUNS_BY_CASE[run.name] = run
    on = f"{run.slices} x {run.accelerator}" if run.slices > 1 else run.accelerator
    return Case(name=run.name, kind="measured", title=f"{run.setup.split(',')[0]} training step on {on}",
                chip=run.chip, slice=run.topology + (f" x {run.slices} slices over DCN" if run.slices > 1 else ""),
                setup=run.setup, published=run.published,
                published_s=run.published_s, source=run.source, where=run.where, predict=predictor(run),
                conversion=run.conversion, model=f"validation/{run.script} through `tpusim run` (product path)",
                slow=run.slow or run.compiler == "xla", path="product", mode=run.mode, compiler=run.compiler,
                script=f"validation/{run.script}", family=run.family, slices=run.slices,
                twin=run.twin)


CASES: tuple[Case, ...] = tuple(case(run) for run in PRODUCT_RUNS)


def with_compiler(cases: list[Case], compiler: str) -> list[Case]:
    """``cases`` with each training product case priced through ``compiler`` ("xla": the TPU compiler's programs,
    recorded with its op programs; "both": the model's case and the compiler's, side by side, the latter named
    ``NAME@xla``); other cases as they are."""
    if compiler == "model":
        return list(cases)
    out = []
    for c in cases:
        run = RUNS_BY_CASE.get(c.name)
        if run is None:
            out.append(c)
            continue
        xla = case(dataclasses.replace(run, name=f"{run.name}@xla", compiler="xla"))
        out += [c, xla] if compiler == "both" else [xla]
    return out
__all__ = ["CASES", "PRODUCT_RUNS", "RECIPES", "ProductRun", "command", "recording"]
