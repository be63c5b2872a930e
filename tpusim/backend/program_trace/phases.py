"""Inference phases marked by the user: ``with tpusim.backend.phase("prefill"):`` around the prompt's forward pass,
``with tpusim.backend.phase("decode"):`` around each output-token step of the batch.

Why a marker: the report tells prefill from decode by itself (tpusim/report/inference.py reads the attention
shapes), but a script that says which is which is never guessed wrong. A phase is recorded as two zero-second
``dispatch`` host records (reason ``phase:<name>`` on entry, ``phase:end`` on exit: tpusim/trace/records.py
``PHASE_REASON``), which cost nothing and cut no Fused eager cluster. Call it outside a torch.compile'd function
(inside one Dynamo would break the graph there). Outside a recording it does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tpusim.backend.program_trace.recorder import record_host
from tpusim.errors import TpusimError
from tpusim.trace.phases import END
from tpusim.trace.records import PHASE_REASON, PHASES


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark the work inside the block as one inference phase: "prefill" (the prompt) or "decode" (one output
    token for the whole batch; enter it once per token)."""
    if name not in PHASES:
        raise TpusimError(f"tpusim.backend.phase({name!r}): the phase must be one of {', '.join(PHASES)} "
                          f"(\"decode\" once per output-token step)")
    record_host("dispatch", PHASE_REASON + name)
    try:
        yield
    finally:
        record_host("dispatch", PHASE_REASON + END)
