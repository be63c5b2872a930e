"""The PyTorch "tpu" device (PrivateUse1) on the simulator target: ``tpusim.backend``.

Importing this package registers the device (it also happens at ``import torch`` through the
``torch.backends`` entry point, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0)::

    import torch, tpusim.backend as tb
    x = torch.randn(4, 4, device="tpu")
    with tb.recording() as rec:
        y = (x @ x).relu().sum().item()
    trace = rec.trace          # tpusim.trace.records.Trace: ops, host syncs, memory, steps

Settings come from the TPUSIM_* environment variables at import, or from a caller before the first
tensor: ``tb.configure(tb.DeviceConfig(chip=tpusim.hardware.spec.load_chip("v5e"), numerics=False))``
(``tb.load_config(chip=...)``: the given fields, the rest from the environment).

Map: shim.py (compile/load csrc/), device.py (registration, ``configure``), config.py (the typed
``DeviceConfig``; TPUSIM_* variables), state.py (process state, the held target), tpu_module.py
(torch.tpu), fallback.py (the boxed fallback), schema.py (what an overload's schema says),
kernels.py (hand-written kernels table), targets/ (what computes op values: sim, pjrt),
policy.py (float64), debug.py (debug eager mode: NaN/Inf check and log per op), costs.py (tensors
as the shared cost rules' metadata), recorder.py (trace), native_hooks.py (the shim's item/copy events), source.py (user
source lines), compiler.py (Dynamo/Inductor takeover), import_hooks.py (post-import hooks),
compile.py + program.py + lowering/ (torch.compile), distributed/ (c10d), torchtpu/ (TorchTPU's
torch.tpu names; torch.tpu.distributed, .compiler, .ops).
"""

from __future__ import annotations

import sys as _sys


def _autoload() -> None:
    """``torch.backends`` entry point. Loading it imports this package, which registers the device.
    Defined before anything imports torch: ``import tpusim.backend`` first imports torch, whose
    autoload then finds this package half-imported and must find this function already."""



from tpusim.backend.device import register as _register  # noqa: E402


def _autoloading() -> bool:
    """True while torch's ``import torch`` runs the torch.backends entry points."""
    frame = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_import_device_backends":
            return True
        frame = frame.f_back
    return False


try:
    _register()
except Exception as _err:  # at `import torch`, warn instead of breaking torch for everyone
    if not _autoloading():
        raise
    import warnings as _warnings

    _warnings.warn(f"tpusim: the tpu device was not registered during `import torch`: {_err} "
                   f"(TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns the autoload off)", RuntimeWarning, stacklevel=2)

from tpusim.backend.config import DeviceConfig, load_config  # noqa: E402
from tpusim.backend.debug import TpuNonFiniteError  # noqa: E402
from tpusim.backend.device import configure  # noqa: E402
from tpusim.backend.phases import phase  # noqa: E402
from tpusim.backend.policy import TpuFloat64Warning, non_native_ops  # noqa: E402
from tpusim.backend.recorder import Recording, recording, start, step, stop  # noqa: E402

__all__ = ["DeviceConfig", "Recording", "TpuFloat64Warning", "TpuNonFiniteError", "configure", "load_config",
           "non_native_ops", "phase", "recording", "start", "step", "stop"]


from tpusim.backend.compile import compile_stats, dump_stablehlo  # noqa: E402,F401  (torch.compile backend="tpu")
