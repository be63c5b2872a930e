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

Rooms (each sub-package's docstring maps its modules; each imports only the rooms below it, pyproject.toml's
"backend's rooms" contract): device/ (registration and ``configure``, torch.tpu, Dynamo's and Inductor's "tpu"
entries, exit, the measured run's worker), torch_compile/ (``backend="tpu"``: Dynamo graph -> JAX -> one XLA
program), distributed/ (the c10d backend "tpusim"), torchtpu/ (TorchTPU's torch.tpu names), targets/ (what
computes op values: sim, pjrt), dispatch/ (the boxed fallback and what runs at each eager op: --numerics tpu,
debug mode's check, offloads, RNN layers), program_trace/ (the recorder, op costs, priced programs, phases),
lowering/ (ATen -> JAX), aten/ (per-op facts and additions: schema, hand-written kernels, shape functions, fused
attention, float64 policy), plumbing/ (settings, process state, the shim's loader for csrc/, hooks, user source
lines). csrc/ is the C++ shim.
"""

from __future__ import annotations

import sys as _sys


def _autoload() -> None:
    """``torch.backends`` entry point. Loading it imports this package, which registers the device.
    Defined before anything imports torch: ``import tpusim.backend`` first imports torch, whose
    autoload then finds this package half-imported and must find this function already."""



from tpusim.backend.device.registration import register as _register  # noqa: E402


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

from tpusim.backend.aten.float64_policy import TpuFloat64Warning, non_native_ops  # noqa: E402
from tpusim.backend.device.registration import configure  # noqa: E402
from tpusim.backend.dispatch.debug_mode import TpuNonFiniteError  # noqa: E402
from tpusim.backend.plumbing.config import DeviceConfig, load_config  # noqa: E402
from tpusim.backend.program_trace.phases import phase  # noqa: E402
from tpusim.backend.program_trace.recorder import Recording, recording, start, step, stop  # noqa: E402

__all__ = ["DeviceConfig", "Recording", "TpuFloat64Warning", "TpuNonFiniteError", "configure", "load_config",
           "non_native_ops", "phase", "recording", "start", "step", "stop"]


from tpusim.backend.torch_compile.jax_backend import compile_stats, dump_stablehlo  # noqa: E402,F401  (torch.compile backend="tpu")
