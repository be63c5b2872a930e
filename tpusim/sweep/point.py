"""Price one sweep point: the recorded trace on one chip / slice / mode / placement -> one table row.

This is what a Dask task runs on a worker, so it is a plain function of picklable values that never
raises for a point that cannot be priced (a topology the chip has no such shape of, a placement the mesh
does not fit): that is a row with ``status`` "invalid" and the reason. Anything else (a worker killed, a
bug) propagates so Dask retries the task and the sweep reports it if it keeps failing.
"""

from __future__ import annotations

import time
from typing import Any

from tpusim.errors import TpusimError
from tpusim.sweep.grid import DEFAULT_PLACEMENT, Point
from tpusim.trace.records import Trace

COLUMNS = ("chip", "calibrated", "topology", "slices", "mode", "placement", "chips", "chips_used", "status",
           "step_time_s", "total_s", "hfu", "mfu", "tflops_per_s_per_chip", "tokens_per_s_per_chip", "ttft_s",
           "tpot_median_s", "hbm_peak_bytes", "hbm_peak_fraction", "collective_exposed_s", "host_stall_s", "kernels",
           "bound", "price_wall_s", "worker", "error")


def point_slice(point: Point):
    """The point's Slice (bad chip/topology pairs raise TpusimError here, before any pricing)."""
    from tpusim.slice.topology import build_slice

    return build_slice(point.topology, chip=point.chip, slices=point.slices, calibrated=point.calibrated)


def price_point(trace: Trace, point: Point, tokens_per_step: int | None = None, compiler: str = "auto"
                ) -> dict[str, Any]:
    """One row: the point, then its headline numbers (report.json's per-mode section, the same numbers
    ``tpusim run`` reports), or ``status`` "invalid" with the reason. An inference program (decode steps, no
    training steps) also gets its time to first token and median time per output token, and its decode
    tokens/s per chip (report.json's ``inference``). ``compiler`` is run's --compiler: the point is priced on
    what the TPU compiler builds for its chip, through the same door as ``tpusim run``
    (``tpusim.pricing.compiled``)."""
    from tpusim.eager.modes import get_mode
    from tpusim.placement import apply_placement
    from tpusim.pricing import price
    from tpusim.pricing.compiled import ask_compiler, compiler_output
    from tpusim.report.inference import inference_section
    from tpusim.report.lint import uses_one_chip
    from tpusim.report.model import device_split, mode_report

    began = time.perf_counter()
    row: dict[str, Any] = {"chip": point.chip, "calibrated": point.calibrated, "topology": point.topology,
                           "slices": point.slices,
                           "mode": point.mode, "placement": point.placement}
    try:
        slice_ = point_slice(point)
        row["chips"] = slice_.total_chips
        row["chips_used"] = 1 if uses_one_chip(trace) else slice_.total_chips    # a one-chip script idles the rest
        placed = apply_placement(trace, slice_, None if point.placement == DEFAULT_PLACEMENT else point.placement)
        compiled = compiler_output(ask_compiler(placed, slice_.chip, compiler))
        timeline = price(placed, topology=slice_, mode=get_mode(point.mode), compiled=compiled)
        entry = mode_report(timeline, placed, slice_, tokens_per_step)
        serving = inference_section(placed, {point.mode: timeline}, slice_.chip, slice_.total_chips, device_split)
    except TpusimError as error:
        return {**row, "status": "invalid", "error": str(error), "price_wall_s": time.perf_counter() - began}
    head = entry["headline"]
    decode = (serving or {}).get("modes", {}).get(point.mode) or {}
    return {**row, "status": "ok", "step_time_s": entry["step_time_median_s"], "total_s": entry["total_s"],
            "hfu": entry["hfu"], "mfu": head.get("model_flops_utilisation"),
            "tflops_per_s_per_chip": head.get("tflops_per_s_per_chip"),
            "tokens_per_s_per_chip": decode.get("tokens_per_s_per_chip", head.get("tokens_per_s_per_chip")),
            "ttft_s": decode.get("ttft_s"), "tpot_median_s": decode.get("tpot_median_s"),
            "hbm_peak_bytes": entry["hbm"]["peak_bytes"], "hbm_peak_fraction": entry["hbm"]["peak_fraction"],
            "collective_exposed_s": entry["device_s"]["collective_exposed"], "host_stall_s": entry["host_s"]["stall"],
            "kernels": entry["kernels"], "bound": head.get("bound"), "price_wall_s": time.perf_counter() - began,
            "error": None}
