"""Record once, price many: one trace priced per eager mode, chip and topology by replay.

    from tpusim.pricing import price
    timeline = price(trace, topology="3d:8x8x8", mode="fused")

Modes are engine queue policies (``tpusim.modes``: debug, strict, fused); adding one =
one entry in ``tpusim.modes.MODES``.
"""

from __future__ import annotations

from collections.abc import Callable

from tpusim.engine import Timeline, simulate
from tpusim.errors import TpusimError
from tpusim.modes import DEFAULT_MODE, MODES, get_mode
from tpusim.spec import ChipSpec
from tpusim.topology import Slice, build_slice
from tpusim.trace import Trace

__all__ = ["DEFAULT_MODE", "MODES", "price", "resolve_modes", "single_chip_topology"]


def resolve_modes(text: str) -> list[str]:
    """'strict' -> ['strict']; 'all' -> every mode; 'debug,fused' -> both. Unknown names are refused."""
    names = list(MODES) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise TpusimError(f"unknown eager mode {', '.join(unknown) or repr(text)}; "
                          f"accepted: {', '.join(MODES)} or all")
    return names


def single_chip_topology(chip: ChipSpec) -> str:
    """The default slice of `tpusim run`: one chip of the chosen generation."""
    return f"{chip.torus_dims}d:" + "x".join("1" * chip.torus_dims)


def price(trace: Trace, *, topology: str | Slice = "", chip: str | ChipSpec | None = None,
          mode: str = DEFAULT_MODE, chunk_bytes: int | None = None,
          progress: Callable[[str], None] | None = None) -> Timeline:
    """Simulate ``trace`` on a slice under one eager mode and return its Timeline."""
    slice_ = topology if isinstance(topology, Slice) else build_slice(topology or "3d:1x1x1", chip=chip)
    policy = get_mode(mode)  # an unknown name raises with the accepted ones
    if progress:
        progress(f"pricing {mode} mode on {slice_.spec} ({slice_.chip.name})")
    return simulate(trace, slice_, chunk_bytes=chunk_bytes, policy=policy)
