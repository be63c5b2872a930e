"""report.json as one typed model: ``Report`` (pydantic), its field names the JSON keys.

``build_report`` (report/model.py) returns a ``Report``; ``report_json`` writes it (sorted keys, floats
as ``build_report`` rounded them, only the keys that were set, so the same inputs give the same bytes);
``load_report`` (report/load.py) validates a report.json into it; ``json_schema`` is its JSON Schema
(written beside report.json as report.schema.json). What each field means: the schema in report/model.py.

Numbers keep the kind they were built with (an int stays an int, a float a float: ``Num``), so a report
read back and written again is the same file. Fields that older versions (``READ_VERSIONS``) lack are
optional with a default; ``model_dump(exclude_unset=True)`` leaves out what a report did not have.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError


def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("number", "a number")
    if isinstance(value, int) and abs(value) > _FLOAT_MAX:      # every reader turns it into a float
        raise PydanticCustomError("number", "a number within +-1.8e308")
    return value


def _finite(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("finite", "a finite number")
    if not math.isfinite(_number(value)):
        raise PydanticCustomError("finite", "a finite number")
    return value


def _positive(value: Any) -> int | float:
    if not _finite(value) > 0:
        raise PydanticCustomError("positive", "a finite number > 0")
    return value


_FLOAT_MAX = int(sys.float_info.max)


def _with_exposed(split: dict[str, Any]) -> dict[str, Any]:
    if "collective_exposed" not in split:
        raise PydanticCustomError("missing_key", "collective_exposed")
    return split


Num = Annotated[int | float, PlainValidator(_number), WithJsonSchema({"type": "number"})]
Finite = Annotated[int | float, PlainValidator(_finite), WithJsonSchema({"type": "number"})]
Positive = Annotated[int | float, PlainValidator(_positive), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})]
Seconds = dict[str, Num]
DeviceSeconds = Annotated[dict[str, Num], AfterValidator(_with_exposed), WithJsonSchema(
    {"type": "object", "additionalProperties": {"type": "number"}, "required": ["collective_exposed"]})]


class Part(BaseModel):
    """A section of report.json: strict types, no unknown keys, frozen."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Open(Part):
    """A section whose keys come from elsewhere (they may grow): unknown keys kept as they are."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class ErrorInfo(Part):
    type: str
    traceback: str | None = None


class InterruptedInfo(Part):
    script: bool
    pricing: bool
    not_priced: list[str]
    by: str = "Ctrl-C"                  # versions before it say nothing: Ctrl-C was the only way


class RankStoppedInfo(Part):
    rank: int
    after_step: int
    steps: int
    records: int


class RecordingStoppedInfo(Part):
    after_step: int
    steps: int
    max_records: int
    note: str
    records: int = 0
    ranks: list[RankStoppedInfo] = []


class RunSection(Part):
    script: str
    argv: list[str]
    topology: str
    chip: str
    numerics: str
    torch_version: str
    modes: list[str]
    tpusim_version: str | None = None
    world_size: int | None = None
    target: str | None = None
    tokens_per_step: int | None = None


class ChipSection(Open):
    name: str
    display_name: str
    peak_bf16_flops_per_s: Positive         # a chip's rates: what every time in the report divides by
    hbm_bytes_per_s: Positive
    peak_flops_per_s: dict[str, Num] | None = None   # matmul peak per dtype class (bf16, f32, int8, fp8), as priced
    hbm_bytes: Num | None = None
    ici_link_bytes_per_s: Num | None = None
    mxu_size: int | None = None
    calibration: str | None = None     # the calibration file priced with (topologies/calibration/...), or "datasheet"

    @property
    def calibrated(self) -> bool:
        """Priced with a calibration file (a report from before the field existed was not)."""
        return self.calibration not in (None, "datasheet")


class SliceSection(Open):
    chips: int
    dims: list[int]
    spec: str | None = None
    chip: str | None = None
    default_chip_used: bool | None = None
    shape_note: str | None = None
    axis_names: list[str] | None = None
    wrap: list[bool] | None = None
    twisted: bool | None = None
    slices: int | None = None
    chips_per_slice: int | None = None
    hosts: int | None = None
    links: int | None = None
    diameter_hops: int | None = None
    bisection_links: int | None = None
    bisection_bytes_per_s: Num | None = None
    ici_link_bytes_per_s: Num | None = None
    ici_hop_latency_ns: Num | None = None
    dcn_bytes_per_s: Num | None = None
    dcn_slice_bytes_per_s: Num | None = None
    faults: dict[str, Any] | None = None


class ProgramSection(Part):
    ops: int
    collectives: int
    syncs: int
    steps: int
    model_flops: Num
    ranks_recorded: int = 1


class StepsInfo(Part):
    count: int
    warmup: int
    compiles: list[int] = []
    reason: str = ""
    steady_median_s: Num | None = None
    steady_start_s: Num | None = None
    steady_end_s: Num | None = None


class Headline(Open):
    step_s: Num | None = None
    tokens_per_step: int | None = None
    tokens_per_s_per_slice: Num | None = None
    tokens_per_s_per_chip: Num | None = None
    flops_per_step_per_chip: Num | None = None
    tflops_per_s_per_chip: Num = 0.0
    hfu: Num | None = None                  # hardware FLOPs utilisation: every FLOP run (version 6 on; was mfu)
    peak_flops_per_s: Num | None = None     # the FLOP-weighted peak HFU and MFU divide by (was mfu_peak_...)
    model_flops_per_step_per_chip: Num | None = None
    model_flops_utilisation: Num | None = None
    flops_by_dtype: dict[str, Num] = {}
    hbm_peak_bytes: Num | None = None
    hbm_peak_fraction: Num | None = None
    exposed_comm_share: Num | None = None
    bound: str | None = None
    bound_shares: dict[str, Num] = {}
    verdict: str | None = None
    levers: list[str] = []


class HostSeconds(Part):
    dispatch: Num
    stall: Finite
    transfer: Num = 0.0
    compile: Num = 0.0


class Recompile(Part):
    seq: int
    source: str
    op: str
    old_shapes: Any
    new_shapes: Any


class CompileCache(Part):
    hits: int
    misses: int
    recompile_count: int
    recompiles: list[Recompile]
    regions: int | None = None
    compile_s: Num | None = None


class Hbm(Part):
    peak_bytes: Finite
    capacity_bytes: Num
    peak_fraction: Num | None = None


class TopOp(Part):
    op: str
    source: str
    count: int
    seconds: Num
    flops: Num
    bytes: Num
    bound: str
    dtype: str = ""


class CollectiveCall(Open):
    seq: int
    kind: str
    bytes: Num
    group_size: int
    axes: list[str]
    algorithm: str
    reason: str
    time_s: Num
    closed_form_s: Num
    contention_s: Num
    source: str
    rank_bytes: Any = None
    async_: bool | None = None

    model_config = ConfigDict(strict=True, extra="allow", frozen=True, populate_by_name=True,
                              alias_generator=lambda name: "async" if name == "async_" else name)


class CollectiveGroup(Part):
    kind: str
    group_size: int
    axes: list[str]
    bytes: Num
    source: str
    count: int
    algorithms: list[str]
    total_s: Num
    closed_form_total_s: Num
    contention_total_s: Num
    total_bytes: Num


class BusyLink(Part):
    link: str
    utilisation: Num
    bytes: Num
    simulated: bool = True


class Links(Part):
    max_utilisation: Num
    mean_utilisation: Num
    busy_links: int
    busiest: list[BusyLink]
    per_chip: list[list[Any]] = []
    per_chip_axis: list[list[Any]] = []
    simulated_links: int = 0
    window_s: Num | None = None


class HostStall(Part):
    reason: str
    source: str
    seconds: Num


class XlaProgramRow(Part):
    """modes.<mode>.xla.per_program[]: one compiled graph, its executions priced three ways."""

    label: str
    devices: int
    executions: int
    fusions: int
    kernels: int
    estimated_s: Num
    priced_s: Num
    model_s: Num
    hbm_peak_bytes: int
    compile_s: Num
    cached: bool


class XlaOps(Part):
    """modes.<mode>.xla.ops: eager ops XLA compiled one by one (Strict, Debug) and Fused clusters XLA compiled
    (Fused); their calls in this mode priced three ways."""

    signatures: int
    compiled: int
    clusters: int = 0                   # distinct Fused eager clusters compiled
    clusters_left: int = 0              # distinct Fused eager clusters left to the model
    calls: int                          # calls run as XLA's kernels in this mode (Fused: clusters)
    priced_s: Num
    estimated_s: Num
    model_s: Num
    fell_back: int


class XlaSection(Part):
    """modes.<mode>.xla: what the TPU compiler built for the compiled programs, priced by tpusim on XLA's
    kernels (priced_s), by XLA itself (estimated_s) and by tpusim's model without it (model_s)
    (tpusim/report/xla.py)."""

    programs: int = 0
    executions: int = 0
    fusions: int = 0
    kernels: int = 0
    estimated_s: Num = 0.0
    priced_s: Num = 0.0
    model_s: Num = 0.0
    hbm_peak_bytes: int = 0
    per_program: list[XlaProgramRow] = []
    ops: XlaOps | None = None
    fell_back: list[str] = []


class Fidelity(Part):
    """modes.<mode>.fidelity: how far this mode has been found from real TPUs (tpusim/report/fidelity.py)."""

    validated_as: str                   # "compile" (the program ran compiled graphs), else the eager mode
    cases: int = 0                      # held-out `tpusim validate` cases of that mode (0: not validated)
    mean_abs_error: Num | None = None
    max_abs_error: Num | None = None


class Offload(Part):
    """modes.<mode>.offload (version 6 on; only when the program offloaded activations to the host): per chip, what
    left HBM and came back, the host memory it held, and the PCIe time (tpusim/report/offload.py)."""

    host_peak_bytes: int                # peak host memory held by offloaded tensors
    d2h_bytes: Num                      # offload copies device -> host
    h2d_bytes: Num                      # their host buffers copied back
    d2h_copies: int = 0
    h2d_copies: int = 0
    pcie_s: Num = 0.0                   # the host link's busy time (every copy of the mode)
    pcie_exposed_s: Num = 0.0           # the part compute did not hide: blocking copies, device waits for a copy


class Dcn(Part):
    """modes.<mode>.dcn (version 6 on; only on more than one slice): per chip, the collectives whose groups span
    slices over DCN, their buffers' bytes, their time and the part compute did not hide (tpusim/report/dcn.py)."""

    slices: int
    collectives: int
    bytes: Num                          # their recorded buffers
    time_s: Num
    exposed_s: Num                      # device waits on them, whole program
    step_exposed_s: Num | None = None   # the same per steady-state step (None without steps)
    dcn_bytes_per_s: Num | None = None  # the chip's DCN rate (topologies/dcn.toml)


class LargestBatch(Part):
    """modes.<mode>.largest_batch (version 6 on; only with --fit-batch ARG): the largest value of the script's batch
    argument whose HBM peak fits the chip, each value tried recorded again shape-only (tpusim/run/batch_fit.py)."""

    argument: str                       # the script's flag, e.g. "--batch"
    value: int                          # the largest found to fit; 0: not even 1 fits
    exact: bool                         # value + 1 was recorded and does not fit (else value is a lower bound)
    capacity_bytes: int                 # the chip's HBM the peaks were held against
    recordings: int                     # recordings the search made (its modes together)
    peak_bytes: int | None = None       # the HBM peak at value (None at 0)
    next_peak_bytes: int | None = None  # at value + 1 (None: not recorded, or it ran out of memory)


class ModeSection(Part):
    """modes.<mode>: one eager mode priced."""

    total_s: Finite
    step_time_median_s: Finite | None           # null: the script marked no steps (version 4 on)
    kernels: int
    hfu: Finite                         # headline.hfu (version 6 on; older reports' mfu)
    host_s: HostSeconds
    device_s: DeviceSeconds             # by term; collective_exposed always there
    hbm: Hbm
    steps_s: list[Num] = []
    first_step_s: Num | None = None
    steps: StepsInfo | None = None
    headline: Headline | None = None
    step_device_s: Seconds | None = None
    collective_overlapped_s: Num = 0.0
    mxu_utilisation: Num = 0.0
    hbm_bytes_moved: Num = 0
    compile_cache: CompileCache | None = None
    fusion: dict[str, Any] | None = None
    top_ops: list[TopOp] = []
    collectives: list[CollectiveCall] = []
    collective_groups: list[CollectiveGroup] = []
    links: Links | None = None
    host_stalls: list[HostStall] = []
    compiler: str | None = None         # who priced the compiled programs: "xla" or "model" (runs with some)
    xla: XlaSection | None = None
    offload: Offload | None = None      # activations kept on the host (version 6 on; absent when none were)
    dcn: Dcn | None = None              # collectives between slices (version 6 on; absent on one slice)
    largest_batch: LargestBatch | None = None   # the largest batch that fits (version 6 on; only with --fit-batch)
    fidelity: Fidelity | None = None    # the mode's validated error band (version 6 on)

    @property
    def time_s(self) -> float:
        """What a mode is ranked by: its step time, or the whole program where no steps are marked."""
        return self.step_time_median_s if self.step_time_median_s is not None else self.total_s

    @property
    def timed(self) -> str:
        """What ``time_s`` is, in words."""
        return "step time" if self.step_time_median_s is not None else "whole program (no steps marked)"


class WarningEntry(Part):
    code: str
    message: str
    source: str = ""


class Inexact(Part):
    kind: str
    source: str
    count: int
    why: str


class DistributedSection(Part):
    ranks: str
    world_size: int
    placement: str
    numerics_rule: str
    not_reference_correct: list[Inexact]


class MeshInfo(Part):
    dim_names: list[str]
    shape: list[int]


class RankedPlacement(Part):
    placement: str
    total_s: Num
    step_s: Num
    collective_s: Num
    by_dim: dict[str, Num]
    axes: dict[str, str]
    algorithms: dict[str, str]


class PlacementsSection(Part):
    mesh: MeshInfo | None
    ranked: list[RankedPlacement]
    reason: str
    default: str | None = None


class Ratio(Part):
    measured: Num | None
    simulated: Num | None


class MeasuredMode(Part):
    steps: int
    steps_s: list[Num]
    first_step_s: Num | None
    step_time_median_s: Num | None
    total_s: Num | None                 # None: the run did not finish
    simulated_step_time_median_s: Num | None
    ratio: Ratio
    target_mode: str | None
    exit_code: int
    error: ErrorInfo | None


class MeasuredSection(Part):
    platform: str
    device_kind: str
    is_tpu: bool
    jax_version: str
    chip: str
    chip_from: str
    baseline: str | None
    notes: list[str]
    modes: dict[str, MeasuredMode]


class InferencePhase(Part):
    """inference.modes.<mode>.prefill / .decode: one phase's window (tpusim/report/inference.py)."""

    time_s: Num                         # the phase's time (decode: every step)
    hfu: Num                            # the phase's FLOPs / (its time x the MXU peak of the dtypes used)
    hbm_utilisation: Num                # HBM bytes the phase's kernels moved / (its time x HBM bandwidth)
    bound: str | None                   # the headline's bound over the window (BOUNDS in report/headline.py)
    bound_shares: dict[str, Num]
    verdict: str | None


class InferenceMode(Part):
    """inference.modes.<mode>: the serving numbers of one eager mode."""

    ttft_s: Num | None                  # time to first token: the prefill's time (null: no prefill found)
    tpot_median_s: Num                  # time per output token: median over the decode steps
    decode_compiles_per_step: Num | None = None   # compile-cache misses per step after the first (version 6 on)
    tpot_p90_s: Num
    decode_steps_s: list[Num]
    decode_s: Num
    tokens_per_s_per_chip: Num | None   # batch x decode steps / decode_s (per chip)
    tokens_per_s_per_slice: Num | None
    roofline_step_s: Num                # (weights + KV cache bytes) / HBM bandwidth: a token step's floor
    roofline_ratio: Num | None          # tpot_median_s / roofline_step_s
    decode_collective_s: Num | None = None    # per decode step: collective time compute does not hide (null: none ran)
    decode_collective_share: Num | None = None   # decode_collective_s / tpot_median_s
    decode_collective_latency_share: Num | None = None   # latency term (overhead + hops x hop latency) / their time
    prefill: InferencePhase | None
    decode: InferencePhase
    verdict: str


class KvCache(Part):
    """inference.kv_cache: the tensors attention reads as K and V (per chip)."""

    bytes: Num                          # the whole cache
    bytes_per_sequence: Num             # bytes / batch
    bytes_per_token: Num                # per sequence and token of context (2 x layers x kv_heads x head_dim x dtype)
    context: int                        # tokens of context the cache holds
    dtype: str
    tensors: int                        # K and V tensors (2 per layer)
    static: bool                        # the same storages every step (a static cache), else grown by cat


class KvFits(Part):
    """inference.fits: what the chip's HBM holds beside the weights (weights and KV cache only)."""

    hbm_bytes: Num
    needed_bytes: Num                   # weights + batch x context x bytes_per_token
    fits: bool
    batch: int
    context: int
    max_batch_at_context: int | None
    max_context_at_batch: int | None
    line: str                           # "batch B at context C fits (...); at context C the largest batch is N"


class InferenceSection(Part):
    """inference: a program with decode steps (version 5 on; null otherwise)."""

    phases_from: str                    # "marked" (tpusim.backend.phase) or "detected" (attention shapes)
    batch: int                          # sequences decoded together (the query's batch)
    prompt_tokens: int | None           # the prefill's query length
    decode_steps: int
    weights_bytes: Num                  # read every decode step and written by none (per chip)
    kv_cache: KvCache | None
    fits: KvFits | None
    modes: dict[str, InferenceMode]


class Report(Part):
    """report.json (schema ``tpusim-report``, versions ``READ_VERSIONS``)."""

    schema_: str
    version: int
    complete: bool
    run: RunSection
    chip: ChipSection
    slice: SliceSection
    program: ProgramSection
    modes: dict[str, ModeSection]
    warnings: list[WarningEntry]
    error: ErrorInfo | None = None
    exit_code: int | None = None
    interrupted: InterruptedInfo | None = None
    recording_stopped: RecordingStoppedInfo | None = None
    distributed: DistributedSection | None = None
    placements: PlacementsSection | None = None
    faults: dict[str, Any] | None = None
    measured: MeasuredSection | None = None
    inference: InferenceSection | None = None     # version 5 on

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True,
                              alias_generator=lambda name: "schema" if name == "schema_" else name)

    def to_dict(self) -> dict[str, Any]:
        """report.json's content: the keys this report has (older versions lack some), JSON keys."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def report_json(report: Report) -> str:
    """report.json's text: sorted keys, one-space indent, a newline at the end (the same bytes every time);
    strict JSON: a value that is not a finite number is written as null (Python's json would write the bare
    NaN or Infinity no JSON reader accepts; issue 32, row 10)."""
    return json.dumps(_finite_or_null(report.to_dict()), indent=1, sort_keys=True, allow_nan=False) + "\n"


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(item) for item in value]
    return value


def json_schema() -> dict[str, Any]:
    """report.json's JSON Schema (draft 2020-12), generated from ``Report``."""
    schema = Report.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "tpusim-report", **schema}
