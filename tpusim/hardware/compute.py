"""What one kernel costs on one chip: a per-op roofline with TPU-specific corrections.

``kernel_cost(op, chip)`` prices an ``OpRecord`` the way XLA's HloCostAnalysis does
(research/simulators.md §1.6): the slowest of the op's compute term and its HBM term,
plus a fixed launch cost. Every rate comes from the ``ChipSpec``; this module holds
no bandwidth or FLOP/s figure of its own.

    seconds = max(compute_s, memory_s) + chip.kernel_launch_ns
    memory_s = (bytes_read + bytes_written) / chip.hbm_bytes_per_s

compute_s per unit:

- ``mxu``: padded matmul FLOPs at the dtype's peak (see ``matmul_padding``); bf16 and
  f16 at ``peak_bf16``, int8 at ``peak_int8``, fp8 at ``peak_fp8``, f32 (and f64,
  which TPUs run as f32) at ``peak_f32``. The peak is the whole chip's: on v4/v5p the
  two TensorCores act as one megacore and XLA splits a kernel across both.
- ``vpu``: ``max(flops / vpu_flops_per_s, transcendentals / transcendentals_per_s)``.
- ``sparsecore``: gathers, scatters and embedding lookups. With SparseCores:
  bytes / ``sparsecore_gather_bytes_per_s`` (and they run beside the TensorCore, see
  the engine). Without (v5e): the TensorCore does it as a VPU loop, one vector op per
  element moved, still bounded by HBM; the cost lands on the TensorCore (``fallback``).
  This is a lower bound: real TensorCore gathers issue one DMA per row and reach well
  under full HBM bandwidth for short rows; a calibrated efficiency would be a new
  ChipSpec field.
- ``dma``: copies are pure HBM traffic (compute_s = 0).

``transfer_seconds`` prices host<->device copies over PCIe.
Adding a unit = one function in ``_UNIT_COST``.

**Calibration terms (opt-in).** A chip carrying ``CalibrationTerms`` (``tpusim.hardware.calibration``
builds such a chip from ``topologies/calibration/<chip>.toml``; ``tpusim validate`` loads it)
prices MXU work at ``mxu_efficiency`` x the peak and HBM traffic at ``hbm_efficiency`` x the
bandwidth: what compiled TPU programs achieve, fitted to published measurements. Two shape terms
make the MXU time depend on the matmul's shape beyond tile padding (``mxu_stream_seconds``):

- ``mxu_weight_load_cycles``: a weight tile enters the array while the previous one computes
  (double buffering), so it is hidden only when the LHS has enough rows; a skinny matmul (few
  rows: decode, small batches) waits for weights: each tile takes max(rows streamed, load) cycles.
  At int8 the MXU streams two rows a cycle, so the floor bites at twice as many rows as bf16.
- ``mxu_fill_drain_cycles``: once per matmul kernel, the systolic array fills before the first
  result and drains after the last (later tiles stream behind without a bubble).

A plain ``ChipSpec`` has no terms, so every number above is unchanged (``calibration_terms``
returns ``NO_TERMS``: shares 1.0, cycles 0). Utilisation stays relative to the datasheet peak.
Achieved HBM bandwidth by access size has no term of its own: the fixed per-kernel cost
(``kernel_launch_ns``, from linear fits of measured TPU kernels that include their DMA start-up)
is the size-independent part, so a small access reaches bytes / (bytes / BW + launch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec
from tpusim.trace.records import HostRecord, OpRecord

# A TPU vector register is 8 sublanes x 128 lanes; the LHS rows of a matmul stream into
# the MXU a vreg at a time, so the row count rounds up to whole sublane groups. This is
# the vreg shape of every generation so far; it moves to ChipSpec if one ever differs.
SUBLANES = 8

BOUNDS = ("mxu", "vpu", "transcendental", "hbm", "sparsecore", "launch")

_DTYPE_ALIASES = {
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "bf16", "half": "bf16", "f16": "bf16", "fp16": "bf16",   # f16 runs as bf16 on the MXU
    "float32": "f32", "float": "f32", "f32": "f32", "fp32": "f32",
    "float64": "f32", "double": "f32", "f64": "f32",                     # TPUs have no f64 MXU path
    "int8": "int8", "uint8": "int8", "i8": "int8", "qint8": "int8", "quint8": "int8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8", "fp8": "fp8",
}
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float64": 8,
             "bfloat16": 2, "float16": 2, "float32": 4, "complex64": 8, "complex128": 16}


@dataclass(frozen=True)
class KernelCost:
    """One kernel's time on one chip and why: ``bound`` names the term that set ``seconds``."""

    seconds: float
    bound: str                  # one of BOUNDS
    compute_s: float            # the compute term (MXU, VPU, transcendental or SparseCore)
    memory_s: float             # the HBM term
    launch_s: float
    flops: float                # useful FLOPs, as recorded
    padded_flops: float         # FLOPs the MXU really performs after tile padding
    bytes: float                # HBM bytes read + written
    mxu_utilisation: float      # useful FLOPs / (seconds x dtype peak); 0 off the MXU
    unit: str = "vpu"           # the unit that ran it: mxu, vpu, sparsecore, dma
    fallback: bool = False      # True when SparseCore work ran on the TensorCore

    @property
    def tile_efficiency(self) -> float:
        """Share of MXU work that is useful (1.0 = no padding; 0.5 = a head dim of 64 on 128 tiles)."""
        return self.flops / self.padded_flops if self.padded_flops else 1.0


@dataclass(frozen=True)
class CalibrationTerms:
    """Opt-in model terms a calibration sets on a chip (module docstring); the defaults change nothing."""

    mxu_efficiency: float = 1.0     # achieved share of the MXU peak (stalls, layout, scheduling)
    hbm_efficiency: float = 1.0     # achieved share of the HBM bandwidth
    mxu_weight_load_cycles: float = 0.0   # per weight tile: fewer LHS rows than this wait for weights
    mxu_fill_drain_cycles: float = 0.0    # per matmul kernel: the systolic array's fill and drain


NO_TERMS = CalibrationTerms()


def calibration_terms(chip: ChipSpec) -> CalibrationTerms:
    """The chip's calibration terms: a calibrated chip (``tpusim.hardware.calibration.CalibratedChip``) carries
    them as ``terms``; a plain ChipSpec has none (``NO_TERMS``)."""
    return getattr(chip, "terms", NO_TERMS)


def dtype_class(dtype: str) -> str:
    """'torch.bfloat16' -> 'bf16': the MXU rate class of a dtype (bf16, f32, int8, fp8)."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _DTYPE_ALIASES:
        raise TpusimError(f"dtype {dtype!r} has no MXU rate; accepted: {', '.join(sorted(_DTYPE_ALIASES))}")
    return _DTYPE_ALIASES[name]


MATMUL_DTYPES = ("bf16", "f32", "int8", "fp8")    # the MXU rate classes (dtype_class's values)


def rate_class(dtype: str) -> str:
    """``dtype_class``, or bf16 for a dtype with no MXU rate (bool, int64) or none recorded (""): what a report
    measures such an op against."""
    if dtype and str(dtype).removeprefix("torch.").lower() in _DTYPE_ALIASES:
        return dtype_class(dtype)
    return "bf16"


def mxu_peak_flops_per_s(chip: ChipSpec, dtype: str) -> float:
    """The chip's matmul peak for a dtype (whole chip, all TensorCores and MXUs)."""
    return {"bf16": chip.peak_bf16_flops_per_s, "f32": chip.peak_f32_flops_per_s,
            "int8": chip.peak_int8_flops_per_s, "fp8": chip.peak_fp8_flops_per_s}[dtype_class(dtype)]


def at_matmul_precision(chip: ChipSpec, bf16_passes: int = 1) -> ChipSpec:
    """``chip`` with f32 matmuls at ``bf16_passes`` MXU passes each. The chip file's f32 peak is the
    datasheet's (six passes, XLA's HIGHEST); a program runs at the precision in effect, and TorchTPU's
    default, DEFAULT, rounds f32 operands to bf16 and takes one pass (HIGH three, HIGHEST six)."""
    return replace(chip, peak_f32_flops_per_s=chip.peak_bf16_flops_per_s / bf16_passes)


def itemsize(dtype: str) -> int:
    name = str(dtype).removeprefix("torch.").lower()
    if name in _ITEMSIZE:
        return _ITEMSIZE[name]
    return 1 if dtype_class(name) in ("int8", "fp8") else 4


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def matmul_padding(matmul: tuple[int, int, int, int], chip: ChipSpec) -> tuple[int, int, int, int]:
    """Pad (batch, m, k, n) to what the MXU really computes.

    The MXU is a ``mxu_size`` x ``mxu_size`` systolic array that holds a k x n weight
    tile while LHS rows stream through it. So k and n pad to multiples of ``mxu_size``
    (128; 256 on v6e): a head dim of 64 fills half the array and wastes half its MACs,
    in QK^T (k = 64) and in PV (n = 64) alike. m only streams, one row per cycle, and
    rounds up to whole 8-sublane vector registers. batch is a loop: no padding.
    """
    batch, m, k, n = matmul
    if min(matmul) <= 0:
        raise TpusimError(f"matmul shape (batch, m, k, n) = {tuple(matmul)} must be positive")
    tile = chip.mxu_size
    return batch, _round_up(m, SUBLANES), _round_up(k, tile), _round_up(n, tile)


def mxu_stream_seconds(matmul: tuple[int, int, int, int], dtype: str, chip: ChipSpec) -> float:
    """MXU seconds of one matmul (batch, m, k, n) of ``dtype``: its weight tiles spread over the
    chip's MXUs at ``mxu_efficiency`` x the peak, each tile streaming the padded m rows (or waiting
    ``mxu_weight_load_cycles`` for its weights when m is shorter), plus one fill and drain of the
    array (module docstring).

    Work spreads over the MXUs in units of one k x n weight tile; a matmul with fewer tiles than
    MXUs leaves some idle (e.g. one 128x128 tile uses 1 of v5p's 8)."""
    terms = calibration_terms(chip)
    batch, m, k, n = matmul_padding(matmul, chip)
    tiles = batch * (k // chip.mxu_size) * (n // chip.mxu_size)
    mxus = chip.mxus_per_chip
    rows_per_s = mxu_peak_flops_per_s(chip, dtype) / mxus / (2.0 * chip.mxu_size ** 2)   # LHS rows one MXU takes
    tile_s = max(m / rows_per_s, terms.mxu_weight_load_cycles / chip.clock_hz)
    return math.ceil(tiles / mxus) * tile_s / terms.mxu_efficiency + terms.mxu_fill_drain_cycles / chip.clock_hz


def _mxu_compute(op: OpRecord, chip: ChipSpec) -> tuple[float, float, str]:
    """(compute_s, padded_flops, bound) for MXU work (``mxu_stream_seconds``)."""
    if op.matmul is None:                                # convolutions etc.: recorded FLOPs, no tiling info
        padded = op.flops
        mxu_s = op.flops / mxu_peak_flops_per_s(chip, op.dtype) / calibration_terms(chip).mxu_efficiency
    else:
        batch, m, k, n = matmul_padding(op.matmul, chip)
        padded = 2.0 * batch * m * k * n
        mxu_s = mxu_stream_seconds(op.matmul, op.dtype, chip)
    trans_s = op.transcendentals / chip.transcendentals_per_s
    return (mxu_s, padded, "mxu") if mxu_s >= trans_s else (trans_s, padded, "transcendental")


def _vpu_compute(op: OpRecord, chip: ChipSpec) -> tuple[float, float, str]:
    vpu_s = op.flops / chip.vpu_flops_per_s
    trans_s = op.transcendentals / chip.transcendentals_per_s
    return (vpu_s, 0.0, "vpu") if vpu_s >= trans_s else (trans_s, 0.0, "transcendental")


def _sparsecore_compute(op: OpRecord, chip: ChipSpec) -> tuple[float, float, str]:
    if chip.sparsecores_per_chip > 0:
        return (op.bytes_read + op.bytes_written) / chip.sparsecore_gather_bytes_per_s, 0.0, "sparsecore"
    # TensorCore fallback: every element moved passes through the VPU once (plus any recorded math).
    elements = op.bytes_written / itemsize(op.dtype)
    vpu_s = max(op.flops, elements) / chip.vpu_flops_per_s
    trans_s = op.transcendentals / chip.transcendentals_per_s
    return (vpu_s, 0.0, "vpu") if vpu_s >= trans_s else (trans_s, 0.0, "transcendental")


def _dma_compute(op: OpRecord, chip: ChipSpec) -> tuple[float, float, str]:
    return 0.0, 0.0, "hbm"


_UNIT_COST: dict[str, Callable[[OpRecord, ChipSpec], tuple[float, float, str]]] = {
    "mxu": _mxu_compute, "vpu": _vpu_compute, "sparsecore": _sparsecore_compute, "dma": _dma_compute,
}


def kernel_cost(op: OpRecord, chip: ChipSpec) -> KernelCost:
    """Price one op on one chip (roofline + launch); see the module docstring for the formulas."""
    if op.unit not in _UNIT_COST:
        raise TpusimError(f"op {op.op} (seq {op.seq}, {op.source or 'no source'}): unit {op.unit!r} "
                          f"is not one of {', '.join(_UNIT_COST)}")
    if min(op.flops, op.transcendentals, op.bytes_read, op.bytes_written) < 0:
        raise TpusimError(f"op {op.op} (seq {op.seq}, {op.source or 'no source'}): flops, transcendentals "
                          f"and bytes must be >= 0")
    compute_s, padded, bound = _UNIT_COST[op.unit](op, chip)
    nbytes = op.bytes_read + op.bytes_written
    memory_s = nbytes / (chip.hbm_bytes_per_s * calibration_terms(chip).hbm_efficiency)
    launch_s = chip.kernel_launch_ns / 1e9
    if memory_s > compute_s:
        bound = "hbm"
    roof_s = max(compute_s, memory_s)
    if launch_s > roof_s:
        bound = "launch"
    seconds = roof_s + launch_s
    util = 0.0
    if op.unit == "mxu" and seconds > 0:
        util = op.flops / (seconds * mxu_peak_flops_per_s(chip, op.dtype))
    return KernelCost(seconds=seconds, bound=bound, compute_s=compute_s, memory_s=memory_s,
                      launch_s=launch_s, flops=op.flops, padded_flops=padded, bytes=nbytes,
                      mxu_utilisation=util, unit=op.unit,
                      fallback=op.unit == "sparsecore" and chip.sparsecores_per_chip == 0)


def transfer_seconds(record: HostRecord, chip: ChipSpec) -> float:
    """Host<->device copy time: bytes over one chip's PCIe link (one way)."""
    if record.event not in ("h2d", "d2h"):
        return 0.0
    return record.bytes / chip.pcie_bytes_per_s
