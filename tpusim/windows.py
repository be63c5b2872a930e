"""Where a fused eager window ends: one cutter fed events, for the simulator and the PJRT target.

Why one module: Fused eager records ops into a window and runs it as fused kernels at a cut. The
simulator's fused mode (``tpusim.fusion.fuse``) prices those windows and the PJRT target
(``backend/targets/pjrt_fused.py``) really compiles them; both feed their events to a
``WindowCutter``, so the windows they make are the same by construction (a program recorded on
the PJRT target is priced with the windows that ran).

Feed the cutter an event, get the reason to end the pending window first, or None:

- ``admit(fusible)``: an eager op. A non-fusible op (fusion role ``opaque``: SparseCore and DMA
  work, sorts, ops without counted work) cuts (``opaque``) and then runs alone; a fusible op
  arriving at a full window (``WINDOW_OPS``) cuts (``size``) and starts the next one.
- ``boundary(reason)``: anything else that ends a window (``CUTS`` lists them with why).

The cutter counts the windows that held ops and why each ended (``cuts``); ending an empty
window counts nothing. Adding a cut reason = one row in ``CUTS``.
"""

from __future__ import annotations

from collections import Counter

# Ops a window may hold. Large enough for an optimizer step: PyTorch's default (foreach)
# optimizers run each update stage for every parameter before the next stage, so one
# parameter's chain (lerp, mul, addcmul, sqrt, div, addcdiv...) spans params x stages ops,
# ~250 for 50 parameters x 5 stages; at 64 such chains are cut and barely fuse. Small enough to
# bound what a window costs: the device waits while the host records it (256 x ~7.5 us ~ 2 ms,
# hidden behind the previous window's kernels in a long step), the grouping pass is quadratic
# in the window, and a window is the largest region the compile cache keys on.
WINDOW_OPS = 256

# Why a window ends. Adding a cut reason = one row here.
CUTS: dict[str, str] = {
    "sync": "the host reads a value (.item(), .cpu(), print, synchronize)",
    "h2d": "a host->device copy",
    "d2h": "a device->host copy",
    "opaque": "an op fusion does not fuse (gathers, fills, device copies, sorts, topk): it runs alone",
    "collective": "a collective: the network prices it as its own kernel",
    "program": "a torch.compile'd graph runs: it is a window of its own",
    "step": "a training step ended (optimizer.step())",
    "mode": "the eager mode changed: what was recorded runs as it was",
    "size": f"the window holds {WINDOW_OPS} ops",
    "end": "the program (or the PJRT target's flush) ended",
    # only the PJRT target, which runs on host memory, needs these three
    "alias": "an op writes a storage holding a pending value under another view, or reads a view of it "
             "the program cannot derive (another dtype, bytes outside the pending value)",
    "host": "an op that runs outside the window (host generator, hand-written kernel, no lowering, "
            "a non-tensor result) reads or writes a pending value",
    "resize": "an op whose out= or self must change shape (other than an empty out=) reads or writes a "
              "pending value: it runs at once",
}


class WindowCutter:
    """The pending window's size and the cuts made so far (see the module docstring)."""

    def __init__(self, limit: int = WINDOW_OPS) -> None:
        self.limit = limit
        self.size = 0                   # ops in the pending window
        self.windows = 0                # windows that held ops and ended
        self.cuts: Counter[str] = Counter()

    def admit(self, fusible: bool) -> str | None:
        """An eager op arrives. Returns the reason to end the pending window before it, or None; a
        fusible op then joins the (new) window, a non-fusible one runs alone."""
        if not fusible:
            return self.boundary("opaque")
        reason = self.boundary("size") if self.size >= self.limit else None
        self.size += 1
        return reason

    def boundary(self, reason: str) -> str:
        """End the pending window for ``reason`` (a key of ``CUTS``); counted when it held ops."""
        if reason not in CUTS:
            raise ValueError(f"unknown window cut {reason!r}; accepted: {', '.join(CUTS)}")
        if self.size:
            self.windows += 1
            self.cuts[reason] += 1
        self.size = 0
        return reason
