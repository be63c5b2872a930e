"""float64/complex policy: TPUs have no native float64 or complex arithmetic.

Default (TPUSIM_F64=warn): such ops run on the host anyway, with a warning once per op, and
each op is listed (``non_native_ops()``, and the trace's ``meta["f64_ops"]``) so the cost
report can say what a real TPU would not run. TPUSIM_F64=error raises instead (at the first op that computes
in float64/complex; creating, filling and copying such tensors is allowed); TPUSIM_F64=allow is silent.
Torch's own tensor printing (which formats values in float64) is exempt.

Ops that make complex results from real inputs (``NON_NATIVE_RESULTS``: eig, FFTs of real signals)
meet the policy at that op too, before they run, although none of their inputs is float64/complex
(adding such an op = one row there).
"""

from __future__ import annotations

import warnings

import torch

from tpusim.backend.plumbing.source import user_source_and_print
from tpusim.backend.plumbing.state import STATE
from tpusim.trace.ops import Family, family_of

NON_NATIVE_DTYPES = frozenset({torch.float64, torch.complex32, torch.complex64, torch.complex128})
_SEEN: set[str] = set()
# ops whose results are complex even from real inputs (aten names, as recorded); the fallback sends them
# to the policy whatever their inputs (tpusim/backend/dispatch/fallback.py)
NON_NATIVE_RESULTS = frozenset({
    "aten::linalg_eig",          # torch.linalg.eig: complex eigenvalues and eigenvectors
    "aten::_linalg_eigvals",     # torch.linalg.eigvals
    "aten::_fft_r2c",            # torch.fft.fft / rfft / fftn / stft of a real signal
    "aten::view_as_complex",     # a float (..., 2) tensor read as complex
    "aten::complex",             # torch.complex(real, imag)
    "aten::polar",               # torch.polar(abs, angle)
})


class TpuFloat64Warning(UserWarning):
    """An op ran in float64/complex on the host: a real TPU does not support it natively."""


def non_native_ops() -> list[str]:
    """Ops that ran in float64/complex so far in this process."""
    return sorted(_SEEN)


def non_native(op_name: str, inputs: list[torch.Tensor]) -> None:
    """Apply the policy to one op with float64/complex tpu inputs (or dtype argument)."""
    if family_of(op_name) == Family.DATA_MOVEMENT:   # filling/copying float64 is not arithmetic: allowed in every mode
        return
    mode = STATE.config.f64 if STATE.config is not None else "warn"
    where, printing = user_source_and_print()
    if printing:            # torch's tensor printing formats values in float64: not the user's op
        return
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in inputs if t.dtype in NON_NATIVE_DTYPES})
    if dtypes or op_name not in NON_NATIVE_RESULTS:
        what = "/".join(dtypes) or "float64"
        on = f"on {what} tensors"
    else:
        what = "complex"
        on = "making complex results"
    if mode == "error":
        raise RuntimeError(
            f"tpusim: {op_name} {on}{' at ' + where if where else ''}: TPUs have no native "
            f"float64/complex arithmetic. Cast to float32 or bfloat16, or unset TPUSIM_F64=error to run such "
            f"ops on the host with a warning.")
    first = op_name not in _SEEN
    _SEEN.add(op_name)
    if first and mode == "warn":
        warnings.warn(
            f"tpusim: {op_name} ran in {what} on the host; TPUs have no native float64/complex arithmetic, so "
            f"a real TPU would not run it like this (warned once per op; TPUSIM_F64=error makes it an error, "
            f"TPUSIM_F64=allow silences it).", TpuFloat64Warning, stacklevel=3)
