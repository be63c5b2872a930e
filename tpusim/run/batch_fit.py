"""``--fit-batch ARG``: the largest value of the script's own batch argument whose HBM peak fits the chip, per
eager mode: "will it fit, and what is the biggest batch?" before a TPU reservation is spent.

Why record again: the HBM peak comes from the shapes the script allocates, so a batch the run did not record
cannot be priced from its recording. Each batch tried is the script recorded again by `tpusim run` in a fresh
process (tpusim/run/fresh.py: shape-only, one rank, tpusim's compiler model, its output kept to itself), and
its report.json's ``modes.<mode>.hbm.peak_bytes`` read back against the chip's capacity. Those recordings
run with the device's HBM unlimited (``TPUSIM_HBM_BYTES=0``, unless the user set it), so a batch over the
capacity still gives its peak; a recording stopped by tpusim's out-of-memory error (the user's
TPUSIM_HBM_BYTES) counts as not fitting; any other failure stops the search.

Why this search: the peak is close to affine in the batch (weights, gradients and optimizer state fixed;
activations per sample), so two recordings give a line whose crossing with the capacity is the candidate, and
recording it and the next batch confirms it (fits at b, not at b+1). Where the line was off (allocations
rounded, a peak that grows faster than the batch) the next try is the secant through the bracket's ends, an end
it keeps counting half as much each time (the Illinois rule, so it cannot creep from one side), or the bracket's
middle where an end has no peak. The recordings are shared by the modes, and capped (``RECORDINGS``); a search
the cap stopped gives the largest batch it saw fit, marked not exact.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpusim.errors import TpusimError
from tpusim.report.summary import fit_text
from tpusim.run.fresh import run_fresh
from tpusim.run.options import RunOptions
from tpusim.run.progress import Progress
from tpusim.script import ScriptOutcome
from tpusim.units import ascii_whole, format_bytes

MAX_BATCH = 1 << 16           # the largest batch tried
RECORDINGS = 8                # recordings at most for one mode
PER_FURTHER_MODE = 2          # and this many more for each further mode
OUT_OF_MEMORY = "OutOfMemoryError"    # the script's error when tpusim's device ran out of HBM

Peaks = dict[str, int] | None       # one recording's HBM peak per mode; None: it ran out of memory


@dataclass(frozen=True)
class BatchArgument:
    """The script's batch argument as the command line gives it: its flag and the value the run uses."""

    flag: str
    value: int


def batch_argument(name: str, script_args: Sequence[str]) -> BatchArgument:
    """``--fit-batch NAME`` checked against the script's arguments before the script runs: ``batch`` or
    ``--batch`` names ``--batch``, which the arguments after -- must give a whole number >= 1 (``--batch 8`` or
    ``--batch=8``; the last one counts, as argparse reads it)."""
    flag = name.strip() if name.strip().startswith("-") else f"--{name.strip()}"
    if flag.strip("-") == "" or any(c.isspace() or c == "=" for c in flag):
        raise TpusimError(f"--fit-batch {name!r} names no argument; give the script's batch argument, e.g. "
                          f"--fit-batch batch for -- --batch 8")
    text = None
    for at, arg in enumerate(script_args):
        if arg == flag:
            text = script_args[at + 1] if at + 1 < len(script_args) else ""
        elif arg.startswith(flag + "="):
            text = arg[len(flag) + 1:]
    if text is None:
        raise TpusimError(f"--fit-batch {name}: the script arguments after -- hold no {flag}; give its batch "
                          f"argument, e.g. -- {flag} 8")
    if not ascii_whole(text) or int(text) < 1:
        raise TpusimError(f"--fit-batch {name}: {flag} {text!r} is not a whole number >= 1; give the batch "
                          f"the run uses, e.g. -- {flag} 8")
    return BatchArgument(flag, int(text))


def with_batch(script_args: Sequence[str], flag: str, batch: int) -> tuple[str, ...]:
    """The script's arguments with every ``flag`` given as ``batch`` (``--batch 8`` -> ``--batch 64``)."""
    out = list(script_args)
    for at, arg in enumerate(out):
        if arg == flag and at + 1 < len(out):
            out[at + 1] = str(batch)
        elif arg.startswith(flag + "="):
            out[at] = f"{flag}={batch}"
    return tuple(out)


@dataclass(frozen=True)
class Fit:
    """One mode's answer: ``value`` the largest batch found to fit (0: not even 1 fits); ``exact`` when the next
    batch was recorded and does not fit (else ``value`` is a lower bound: the search's cap stopped it)."""

    value: int
    exact: bool
    peak_bytes: int | None          # the HBM peak at ``value`` (None at 0)
    next_peak_bytes: int | None     # at ``value`` + 1 (None when not recorded, or it ran out of memory)
    capacity_bytes: int


class BatchSearch:
    """The search over one recorder (``record``: a batch -> its peaks per mode), its recordings shared by the
    modes. Pure: the run's recorder is ``Fitter``'s; tests give a function of the batch."""

    def __init__(self, record: Callable[[int], Peaks], modes: Sequence[str], capacity: int, *,
                 max_batch: int = MAX_BATCH, max_recordings: int | None = None) -> None:
        self.record, self.modes, self.capacity, self.max_batch = record, tuple(modes), capacity, max_batch
        self.max_recordings = max_recordings or RECORDINGS + PER_FURTHER_MODE * (len(self.modes) - 1)
        self.points: dict[int, Peaks] = {}

    @property
    def recordings(self) -> int:
        return len(self.points)

    def all_modes(self, start: int) -> dict[str, Fit]:
        return {mode: self.largest(mode, start) for mode in self.modes}

    def largest(self, mode: str, start: int) -> Fit:
        """The largest batch that fits ``mode``, starting from the run's ``start``."""
        self._measure(min(max(start, 1), self.max_batch))
        lo, hi = self._bracket(mode)
        weights = [1.0, 1.0]                    # Illinois: an end the secant keeps twice counts half as much
        moved: list[bool] = []                  # which end each try moved: True the fitting one
        while self.recordings < self.max_recordings and not self._closed(lo, hi):
            stalled = len(moved) >= 2 and moved[-1] == moved[-2]
            batch = self._candidate(mode, lo, hi, weights, stalled)
            self._measure(batch)
            moved.append(self.fits(mode, batch))
            lo, hi = (batch, hi) if moved[-1] else (lo, batch)
            weights[not moved[-1]] = 1.0
            if len(moved) >= 2 and moved[-1] == moved[-2]:
                weights[moved[-1]] /= 2         # the end that stayed: its residual halved
        return Fit(value=lo, exact=hi == lo + 1, peak_bytes=self.peak(mode, lo) if lo else None,
                   next_peak_bytes=self.peak(mode, lo + 1) if lo + 1 in self.points else None,
                   capacity_bytes=self.capacity)

    def fits(self, mode: str, batch: int) -> bool:
        peak = self.peak(mode, batch)
        return peak is not None and peak <= self.capacity

    def peak(self, mode: str, batch: int) -> int | None:
        peaks = self.points[batch]
        return None if peaks is None else peaks[mode]

    def _measure(self, batch: int) -> None:
        if batch not in self.points:
            self.points[batch] = self.record(batch)

    def _bracket(self, mode: str) -> tuple[int, int | None]:
        """The largest batch known to fit (0: none) and the smallest above it known not to (None: none)."""
        lo, hi = 0, None
        for batch in sorted(self.points):
            if hi is not None:
                break
            if self.fits(mode, batch):
                lo = batch
            else:
                hi = batch
        return lo, hi

    def _closed(self, lo: int, hi: int | None) -> bool:
        return (hi - lo <= 1) if hi is not None else lo >= self.max_batch

    def _candidate(self, mode: str, lo: int, hi: int | None, weights: list[float], stalled: bool) -> int:
        """The next batch to record, strictly inside the bracket: where a line through two recorded peaks meets
        the capacity (the bracket's ends, each residual weighted, once both have peaks; else the two recorded
        peaks nearest the capacity, unless that line moved the same end twice); else the bracket's middle, or,
        while nothing is known not to fit, twice the largest fitting batch, then (a line that does not rise:
        the peak does not grow with the batch) the largest batch tried; an eighth of the smallest batch that does
        not fit while none is known to fit (a batch far over the capacity is reached in fewer tries)."""
        peaks = {b: p[mode] for b, p in self.points.items() if p is not None}
        if lo in peaks and hi in peaks:
            ends = [(lo, peaks[lo], weights[0]), (hi, peaks[hi], weights[1])]
        elif stalled and hi is not None:
            ends = []
        else:
            near = sorted(peaks, key=lambda b: (abs(peaks[b] - self.capacity), b))[:2]
            ends = [(b, peaks[b], 1.0) for b in near]
        crossing = _crossing(ends, self.capacity) if len(ends) == 2 else None
        if crossing is None and hi is not None:      # the middle; an eighth while nothing is known to fit
            crossing = (lo + hi) // 2 if lo else hi // 8
        elif crossing is None:
            crossing = 2 * lo if len(ends) < 2 else self.max_batch
        return min(max(crossing, lo + 1), hi - 1 if hi is not None else self.max_batch)


def _crossing(ends: list[tuple[int, int, float]], capacity: int) -> int | None:
    """The largest batch the line through two (batch, peak, weight) points keeps at or under ``capacity``, each
    point's distance from the capacity scaled by its weight; None when the line does not rise."""
    (b1, p1, w1), (b2, p2, w2) = ends
    r1, r2 = (p1 - capacity) * w1, (p2 - capacity) * w2
    slope = (r2 - r1) / (b2 - b1)
    if slope <= 0:
        return None
    return b1 + math.floor(-r1 / slope)


class Fitter:
    """The run's search: records the script in fresh `tpusim run` processes as the run was asked (chip,
    topology, slices, modes), at another value of its batch argument, and reads each report's peaks. Built
    before the script runs, so the folder and environment the recordings start from are the run's, whatever
    the script changes of its own."""

    def __init__(self, options: RunOptions, script: Path, chip: str, capacity: int, progress: Progress) -> None:
        self.options, self.script, self.chip, self.capacity, self.progress = options, script, chip, capacity, progress
        self.argument = batch_argument(str(options.fit_batch), options.script_args)
        self.cwd = os.getcwd()
        self.env = dict(os.environ)
        if not self.env.get("TPUSIM_HBM_BYTES"):      # over the capacity a batch still records, and gives its peak
            self.env["TPUSIM_HBM_BYTES"] = "0"

    def __call__(self, modes: Sequence[str], outcome: ScriptOutcome) -> dict[str, dict[str, Any]] | None:
        """report.json's ``modes.<mode>.largest_batch`` for each of ``modes``, after the run's own ``outcome``
        (None when the script failed but for memory: the search would fail alike); a TpusimError when the script
        failed at some batch for another reason than memory."""
        flag = self.argument.flag
        if outcome.exit_code != 0 and outcome.error_type != OUT_OF_MEMORY:
            self.progress.say(f"fit batch: not searched: the script at {flag} {self.argument.value} did not end "
                              f"cleanly (exit code {outcome.exit_code})")
            return None
        self.progress.say(f"fit batch: searching the largest {flag} whose HBM peak fits {format_bytes(self.capacity)} "
                          f"({', '.join(modes)}): each try records {self.script.name} again, shape-only")
        with tempfile.TemporaryDirectory(prefix="tpusim-fit-batch-") as root:
            search = BatchSearch(lambda batch: self._record(Path(root), batch, modes, search), modes, self.capacity)
            try:
                fits = search.all_modes(self.argument.value)
            except KeyboardInterrupt:           # Ctrl-C, SIGTERM: the run's report is written without it
                self.progress.say(f"fit batch: stopped after {search.recordings} recordings; the report gives no "
                                  f"largest batch")
                raise
        self.progress.say(f"fit batch: the largest {flag} that fits: "
                          + ", ".join(f"{mode} {fit_text(fit.value, fit.exact)}" for mode, fit in fits.items())
                          + f" ({search.recordings} recordings)")
        return {mode: {"argument": flag, **asdict(fit), "recordings": search.recordings} for mode, fit in fits.items()}

    def _record(self, root: Path, batch: int, modes: Sequence[str], search: BatchSearch) -> Peaks:
        flag = self.argument.flag
        self.progress.say(f"fit batch: recording {flag} {batch} (try {search.recordings + 1} of at most "
                          f"{search.max_recordings})")
        folder = root / f"batch-{batch}"
        options = RunOptions(script=str(self.script), script_args=with_batch(self.options.script_args, flag, batch),
                             chip=self.chip, topology=self.options.topology, slices=self.options.slices,
                             modes=tuple(m for m in self.options.modes if m.name in modes), numerics="off",
                             ranks="one", compiler="model", max_records=self.options.max_records, out=str(folder),
                             quiet=True, calibration=self.options.calibration)
        why = run_fresh(options, env=self.env, cwd=self.cwd)
        report = _read_report(folder / "report.json")
        error = (report or {}).get("error") or {}
        if error.get("type") == OUT_OF_MEMORY:
            self.progress.say(f"fit batch: {flag} {batch}: out of memory while recording")
            return None
        peaks = {mode: (report or {}).get("modes", {}).get(mode, {}).get("hbm", {}).get("peak_bytes")
                 for mode in modes}
        if why is not None or error or any(peak is None for peak in peaks.values()):
            what = (_last_line(error.get("traceback")) or error["type"]) if error.get("type") else why
            raise TpusimError(f"--fit-batch {self.options.fit_batch}: the script failed at {flag} {batch} ({what}); "
                              f"no largest batch was found")
        self.progress.say(f"fit batch: {flag} {batch}: HBM peak "
                          + ", ".join(f"{mode} {format_bytes(peak)} ({'fits' if peak <= self.capacity else 'over'})"
                                      for mode, peak in peaks.items()) + f" of {format_bytes(self.capacity)}")
        return {mode: int(peak) for mode, peak in peaks.items()}


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(text: str | None) -> str:
    """A traceback's last line: the error and its message ("ValueError: batch too large")."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""
