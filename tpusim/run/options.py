"""What one `tpusim run` is asked to do, as one typed value: the run pipeline's only input.

``tpusim run`` parses its command line into ``RunOptions.from_args``; ``tpusim check`` builds one directly;
the pytest plugin and ``tpusim sweep``, which record in a fresh process each, turn one back into the
command line that means the same (``argv``), so no caller spells `tpusim run`'s flags by hand. The eager
modes are resolved here, once, into their ``EagerMode`` objects.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Literal

from tpusim.eager.modes import DEFAULT_MODE, MODES, EagerMode, get_mode, resolve_modes
from tpusim.eager.state import mode_from_environment
from tpusim.errors import TpusimError

RANKS = ("auto", "one", "all")
TARGETS = ("sim", "pjrt")
Numerics = Literal["on", "off", "tpu"]
NUMERICS: tuple[Numerics, ...] = ("on", "off", "tpu")   # as --numerics, TPUSIM_NUMERICS and report.json spell them


@dataclass(frozen=True)
class RunOptions:
    """One run: the script and its arguments, where it is priced (chip, topology, faults), how (modes,
    numerics, placement, ranks, target) and within what budgets, and where the report goes."""

    script: str                             # as given: report.json's run.script says it so
    script_args: tuple[str, ...] = ()
    chip: str | None = None                 # None: by topology (v5p for a single chip)
    topology: str | None = None             # None: a single chip
    slices: int = 1                         # copies of --topology joined over DCN (multislice)
    modes: tuple[EagerMode, ...] = field(default_factory=lambda: (MODES[DEFAULT_MODE],))
    numerics: Numerics = "on"               # on: CPU's values; off: shape-only; tpu: a TPU's (--numerics)
    placement: str | None = None            # DeviceMesh dims -> torus axes, e.g. 'tp=x,fsdp=yz'
    compare_placements: bool = False
    ranks: str = "auto"                     # RANKS
    target: str = "sim"                     # TARGETS
    pjrt_timeout_s: float | None = 3600.0   # --target pjrt: None never stops a measured run
    tokens_per_step: int | None = None
    max_records: int | None = None          # the record budget; None: TPUSIM_MAX_RECORDS or its default
    fail_links: str | None = None
    fail_chips: str | None = None
    fault_seed: str | None = None
    out: str | None = None                  # None: a fresh folder under reports/
    compiler: str = "auto"                  # who prices torch.compile graphs: COMPILERS (tpusim/xla/programs.py)
    calibration: bool = True                # the chip's calibration (topologies/calibration/); False: datasheet
    fit_batch: str | None = None            # the script's batch argument ("--batch"): find the largest that fits
    quiet: bool = False
    table: bool = True                      # print the cost table; False (tpusim check): the verdict lines only

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise TpusimError(f"RunOptions.numerics={self.numerics!r}; accepted: {', '.join(NUMERICS)}")

    @property
    def mode_names(self) -> tuple[str, ...]:
        return tuple(mode.name for mode in self.modes)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """`tpusim run`'s parsed command line (the mode text is resolved here; unknown names are refused)."""
        return cls(script=args.script, script_args=tuple(args.script_args), chip=args.chip,
                   topology=args.topology, slices=args.slices, modes=modes_of(args.mode or _mode_from_environment()),
                   numerics=args.numerics,
                   placement=args.placement, compare_placements=args.compare_placements, ranks=args.ranks,
                   target=args.target, pjrt_timeout_s=args.pjrt_timeout or None,
                   tokens_per_step=args.tokens_per_step, max_records=args.max_records,
                   fail_links=args.fail_links, fail_chips=args.fail_chips, fault_seed=args.fault_seed,
                   out=args.out, quiet=args.quiet, compiler=args.compiler,
                   calibration=not args.no_calibration, fit_batch=args.fit_batch)

    def argv(self) -> list[str]:
        """The `python -m tpusim run ...` command line that asks for exactly these options."""
        command = [sys.executable, "-m", "tpusim", "run", str(self.script), "--mode", ",".join(self.mode_names),
                   "--numerics", self.numerics,
                   "--ranks", self.ranks, "--target", self.target, "--compiler", self.compiler]
        flags = {"--chip": self.chip, "--topology": self.topology, "--placement": self.placement,
                 "--tokens-per-step": self.tokens_per_step, "--max-records": self.max_records,
                 "--fail-links": self.fail_links, "--fail-chips": self.fail_chips, "--fault-seed": self.fault_seed,
                 "--out": self.out}
        if self.target == "pjrt":
            flags["--pjrt-timeout"] = self.pjrt_timeout_s or 0
        for flag, value in flags.items():
            if value is not None:
                command += [flag, str(value)]
        command += ["--slices", str(self.slices)] if self.slices != 1 else []
        command += ["--compare-placements"] if self.compare_placements else []
        command += [f"--fit-batch={self.fit_batch}"] if self.fit_batch else []   # "=": its value may start with --
        command += [] if self.calibration else ["--no-calibration"]
        command += ["--quiet"] if self.quiet else []
        return [*command, "--", *self.script_args] if self.script_args else command


def _mode_from_environment() -> str:
    """The mode the script's environment selects (TPUSIM_EAGER_MODE, TorchTPU's variables); a bad value is left to
    the environment check, which names it in its own words, so this gives the default then."""
    try:
        return mode_from_environment(os.environ)
    except TpusimError:
        return DEFAULT_MODE


def modes_of(text: str) -> tuple[EagerMode, ...]:
    """'strict', 'debug,fused' or 'all' -> the modes, in order (unknown names are refused)."""
    return tuple(get_mode(name) for name in resolve_modes(text))


def add_slices_argument(parser: argparse.ArgumentParser) -> None:
    """``--slices N`` as run and check spell it: N copies of --topology joined over DCN."""
    from tpusim.slice.topology import MAX_SLICES, slices_flag

    parser.add_argument("--slices", type=slices_flag, default=1, metavar="N",
                        help=f"multislice: N copies of --topology joined over DCN (1 to {MAX_SLICES}, default 1); "
                             f"the script's world is every chip of every slice, ranks slice by slice, and a "
                             f"DeviceMesh dim over the slices (e.g. ('dcn', 'fsdp')) runs its collectives on DCN")


def add_fit_batch_argument(parser: argparse.ArgumentParser) -> None:
    """``--fit-batch ARG`` as run and check spell it (tpusim/run/batch_fit.py)."""
    parser.add_argument("--fit-batch", metavar="ARG",
                        help="also find the largest value of the script's batch argument ARG (--batch, or batch, for "
                             "its --batch; the arguments after -- must give it, e.g. -- --batch 8) whose "
                             "HBM peak fits the chip, per mode: each value tried records the script again, "
                             "shape-only (at most 8 recordings); the summary's 'largest batch (fits)' row, "
                             "report.json modes.<mode>.largest_batch")
