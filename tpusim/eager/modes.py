"""The eager modes, Debug, Strict and Fused: the one registry of their names and behaviour.

Every other module reads modes from here: the process state (``tpusim.eager.state``), the
device (tpusim/backend/), the mode's plan of a trace (``tpusim.pricing.planning``), the command line and
the report. On the sim target numerics are identical in every mode, so a mode is a cost model
of when work is issued and how it is grouped:

- **strict**: asynchronous like CUDA. The host pays ``chip.host_dispatch_ns`` per op and
  enqueues it (queue of 1024); it waits only at syncs and when the queue is full.
- **debug**: synchronous. Each op completes before the next is issued, then its result is
  checked for NaN/Inf (``tpusim.pricing.planning.with_checks`` prices the check).
- **fused**: the host records ops into windows (``tpusim.eager.windows``, ``tpusim.eager.fusion``) and
  launches each window's fused kernels at a cut.

Adding a mode = one ``EagerMode`` row in ``MODES``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpusim.errors import TpusimError


@dataclass(frozen=True)
class EagerMode:
    """One eager mode: how the host queue behaves and how the mode rewrites the op stream."""

    name: str
    description: str
    queue_depth: int = 1024         # how far the host runs ahead (CUDA's launch queue holds ~1024 kernels)
    sync_each_op: bool = False      # the host waits for each op to finish
    check_results: bool = False     # each op's floating results are checked for NaN/Inf
    fuse: bool = False              # eager ops are recorded into windows and fused
    aliases: tuple[str, ...] = ()   # other accepted spellings: TorchTPU's EagerMode member names


# Adding a mode = one row here.
MODES: dict[str, EagerMode] = {m.name: m for m in (
    EagerMode("debug", "synchronous; every op's results checked for NaN/Inf at the op",
              queue_depth=1, sync_each_op=True, check_results=True, aliases=("defer_never_and_launch_blocking",)),
    EagerMode("strict", "asynchronous like CUDA: errors surface at the next sync", aliases=("defer_never",)),
    EagerMode("fused", "ops recorded into windows and run as fused kernels", fuse=True,
              aliases=("defer_and_fuse",)),
)}
DEFAULT_MODE = "strict"
_BY_SPELLING = {spelling: mode for mode in MODES.values() for spelling in (mode.name, *mode.aliases)}


def get_mode(name: object, where: str = "") -> EagerMode:
    """The mode called ``name`` (case and spaces ignored; aliases accepted); an unknown name is a
    TpusimError that lists the accepted ones (``where`` says where the name came from). A mode passes as itself."""
    if isinstance(name, EagerMode):
        return name
    mode = _BY_SPELLING.get(str(name).strip().lower())
    if mode is None:
        raise TpusimError(f"unknown eager mode {name!r}{where}; accepted: {', '.join(MODES)}")
    return mode


def resolve_modes(text: str) -> list[str]:
    """'strict' -> ['strict']; 'all' -> every mode; 'debug,fused' -> both. Unknown names are refused."""
    if text.strip().lower() == "all":
        return list(MODES)
    names = [m for m in text.split(",") if m.strip()]
    if not names:
        raise TpusimError(f"no eager mode in {text!r}; accepted: {', '.join(MODES)} or all")
    unknown = [m.strip() for m in names if m.strip().lower() not in _BY_SPELLING]
    if unknown:
        raise TpusimError(f"unknown eager mode {', '.join(unknown)}; accepted: {', '.join(MODES)} or all")
    return list(dict.fromkeys(get_mode(m).name for m in names))
