"""Registration: PrivateUse1 becomes the "tpu" device.

Order matters: the shim is configured (devices, HBM, numerics) and its hooks installed before
the rename; ``torch.tpu`` must exist before anything imports torch.testing (OpInfo picks the
device up at import); Dynamo/Inductor are taken over lazily (backend/compiler.py).
"""

from __future__ import annotations

import torch
from tpusim.backend import compiler, debug, fallback, recorder, shim, tpu_module
from tpusim.backend.config import load_config
from tpusim.backend.state import STATE

NAME = "tpu"


def register() -> None:
    """Make device "tpu" available in this process (idempotent)."""
    if STATE.shim is not None:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise RuntimeError(
            f"tpusim: the PrivateUse1 device is already claimed by {current!r} in this process, so \"tpu\" "
            f"cannot be registered. Import tpusim.backend before that backend, or do not load both.")
    cfg = load_config()
    module = shim.load()
    module.configure(cfg.device_count, cfg.hbm_bytes, not cfg.numerics, cfg.chip, cfg.chip_display)
    STATE.config = cfg
    STATE.numerics = cfg.numerics
    STATE.host_device = torch.device("cpu") if cfg.numerics else torch.device("meta")
    STATE.default_generators = tuple(module.default_generator(i) for i in range(cfg.device_count))
    tpu_module.default_generators = STATE.default_generators
    if current != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    torch._register_device_module(NAME, tpu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                         for_packed_sequence=True, for_storage=True)
    torch.set_autocast_dtype(NAME, torch.bfloat16)
    fallback.install()
    recorder.install()
    compiler.install()
    _register_c10d()
    from tpusim import eager

    debug.apply_mode(eager.get_eager_mode())       # TPUSIM_EAGER_MODE is checked here, at import
    eager.on_change(debug.on_change)
    STATE.shim = module


def _register_c10d() -> None:
    """Make "tpusim" the default c10d backend for "tpu" (``init_process_group()`` with no backend,
    ``init_device_mesh("tpu", ...)``). Only the name is registered here; backend/distributed/ is
    imported when the first process group is created, so importing the device stays cheap."""
    import torch.distributed as dist

    if dist.is_available() and "TPUSIM" not in dist.Backend._plugins:
        dist.Backend.register_backend("tpusim", _create_process_group, extended_api=True, devices=[NAME])


def _create_process_group(opts: object, backend_options: object) -> object:
    from tpusim.backend import distributed  # its import installs the launch-time patches (install())

    return distributed.TpusimProcessGroup(opts, backend_options)
