"""The ``measured`` section of report.json (``tpusim run --target pjrt`` only): real wall time per mode
beside the simulator's prediction for it.

Absolute times compare only when JAX runs on the chip that was priced. Elsewhere (JAX on a CPU or
GPU) what compares is the shape of the curve: each mode's median step over the baseline mode's
(strict when it was run), measured and simulated side by side. Wall-clock numbers differ from run to
run, so this section, unlike the rest of report.json, is not byte-identical across runs.

``Measured`` is what ``tpusim run`` hands to ``build_report``; ``measured_section`` is its JSON form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpusim.pricing.timeline import step_stats

BASELINE = "strict"


@dataclass(frozen=True)
class JaxDevice:
    """JAX's default device, as the measured runs will see it."""

    platform: str        # "tpu", "cpu", "gpu"
    device_kind: str     # e.g. "TPU v5 lite", "cpu"
    jax_version: str

    @property
    def is_tpu(self) -> bool:
        return self.platform == "tpu"


@dataclass(frozen=True)
class ModeRun:
    """One mode's measured run: a wall time per step (step i ends at its optimizer.step()) and in all."""

    mode: str
    steps_s: tuple[float, ...] = ()
    total_s: float | None = None        # script start to end, pending device work included; None if unknown
    exit_code: int = 0
    error_type: str | None = None
    error: str | None = None            # the user's traceback, or why the run gave no result
    target_mode: str | None = None      # the PJRT target's own execution mode, as it reported it


def not_tpu_note(platform: str) -> str:
    return (f"JAX device is {platform}: absolute times are not comparable with the TPU prediction; "
            f"compare the ratios between modes")


def notes(device: JaxDevice, chip: str, chip_from: str, world: int = 1) -> list[str]:
    """What a reader must know before comparing the measured times with the prediction."""
    found: list[str] = []
    if not device.is_tpu:
        found.append(not_tpu_note(device.platform))
    elif chip_from == "default":
        found.append(f"JAX device {device.device_kind!r} has no tpusim chip file; priced on {chip} "
                     f"(--chip picks another): compare the ratios between modes")
    elif chip_from == "--chip":
        found.append(f"priced on {chip} (--chip) while JAX runs on {device.device_kind!r}: absolute times "
                     f"compare only if that is the same chip")
    if world > 1:
        found.append(f"the measured run is one process, rank 0 of {world}: its collectives follow the "
                     f"--ranks one rule and move no data between devices")
    return found


@dataclass(frozen=True)
class Measured:
    """The real runs of ``--target pjrt``: JAX's device, the chip the prediction was priced on and why
    ("device", "--chip" or "default"), and one run per mode."""

    device: JaxDevice
    chip: str
    chip_from: str
    runs: tuple[ModeRun, ...]


def measured_section(measured: Measured, simulated: dict[str, dict[str, Any]], world: int = 1) -> dict[str, Any]:
    """The section for report["measured"]; ``simulated`` is report["modes"] (the priced modes), ``world`` the
    ranks the prediction priced (1 for a program without collectives)."""
    device, chip, chip_from, runs = measured.device, measured.chip, measured.chip_from, measured.runs
    medians = {run.mode: step_stats(run.steps_s, run.total_s).median_s for run in runs}
    baseline = BASELINE if BASELINE in medians else (runs[0].mode if runs else None)

    def ratio(value: float | None, base: float | None) -> float | None:
        return value / base if value is not None and base else None

    modes = {}
    for run in runs:
        stats = step_stats(run.steps_s, run.total_s)
        first, step_median = stats.first_s, stats.median_s
        predicted = simulated.get(run.mode, {}).get("step_time_median_s")
        predicted_base = simulated.get(baseline, {}).get("step_time_median_s") if baseline else None
        modes[run.mode] = {
            "steps": len(run.steps_s), "steps_s": list(run.steps_s), "first_step_s": first,
            "step_time_median_s": step_median, "total_s": run.total_s,
            "simulated_step_time_median_s": predicted,
            "ratio": {"measured": ratio(step_median, medians.get(baseline) if baseline else None),
                      "simulated": ratio(predicted, predicted_base)},
            "target_mode": run.target_mode, "exit_code": run.exit_code,
            "error": None if run.error_type is None else {"type": run.error_type, "traceback": run.error},
        }
    return {"platform": device.platform, "device_kind": device.device_kind, "is_tpu": device.is_tpu,
            "jax_version": device.jax_version, "chip": chip, "chip_from": chip_from,
            "baseline": baseline, "notes": notes(device, chip, chip_from, world), "modes": modes}
