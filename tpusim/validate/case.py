"""One fidelity case: a published TPU measurement, how the simulator predicts it, and the answer.

A ``Case`` is data about a published figure (what was measured, on what, where it is published)
plus a ``predict`` function that prices the same setup on a chip (calibrated or not) and returns a
``Prediction``: the predicted seconds and where they go. Cases compare *times*: a throughput
figure (TFLOP/s per chip) is turned into the step time it implies with the publisher's own FLOP
count, and that conversion is part of the case (``published_s``).

``kind`` separates what counts: ``measured`` cases are profiles or benchmark logs of real TPUs;
``analytic`` rows are the publisher's own pen-and-paper estimates (the scaling book's worked
examples), kept as formula checks and never mixed into the fidelity error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpusim.hardware.spec import ChipSpec

KINDS = ("measured", "analytic")
PATHS = ("product", "closed-form")   # closed-form: a step trace built by hand (maxtext.py), kept as a cross-check


@dataclass(frozen=True)
class Prediction:
    """What the simulator says about one case: seconds, and a breakdown that adds up to them.

    ``parts`` name where the time goes, in seconds (collective cases: latency, bandwidth, start-up;
    step cases: compute, memory, launch, exposed collectives, host/idle). ``notes`` are lines for
    ``--explain`` (what was simulated, which algorithm, which kernels dominate)."""

    seconds: float
    parts: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    """A published TPU measurement and how tpusim reproduces it (module docstring)."""

    name: str                      # the case's id: `tpusim validate --case NAME`, `fitted_on = [NAME]`
    title: str                     # one line: what was measured
    kind: str                      # "measured" or "analytic"
    chip: str                      # chip generation name, or the path of a chip file
    slice: str                     # e.g. "2d:8x4 (Y has no wraparound)", "3d:4x4x4", "16 x 2d:16x16 over DCN"
    setup: str                     # parallelism, batch, precision, remat of the published run
    published: str                 # the figure as published, e.g. "680 us (profile)"
    published_s: float             # the figure as a time in seconds (see ``conversion``)
    source: str                    # URL
    where: str                     # section / table / row / commit in the source
    predict: Callable[[ChipSpec], Prediction]
    conversion: str = ""           # how a throughput figure became seconds (empty: it is a time)
    model: str = ""                # modelling choices of the prediction, for --explain and the README
    slow: bool = False             # takes more than a few seconds: not in the default test run
    path: str = "closed-form"      # PATHS: "product" runs a PyTorch script through `tpusim run`'s recording
    mode: str = ""                 # what the script ran as: "compile" (torch.compile'd blocks), "fused", ...
    script: str = ""               # the PyTorch file a product-path case runs
    family: str = ""               # model family (leave-one-family-out); "" = the case's own name
    slices: int = 1                # product cases: copies of the slice's topology joined over DCN
    compiler: str = ""             # product path: who built the compiled programs priced ("model" or "xla")
    twin: str = ""                 # the case that prices the same published figure by the other path: a
                                   # parameter fitted on either one is fitted on both (neither is held out)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"case {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.path not in PATHS:
            raise ValueError(f"case {self.name}: path {self.path!r} is not one of {PATHS}")
        if not self.published_s > 0:
            raise ValueError(f"case {self.name}: published_s must be > 0")
