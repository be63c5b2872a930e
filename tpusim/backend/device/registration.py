"""Registration: PrivateUse1 becomes the "tpu" device, configured by one ``DeviceConfig``.

Order matters: the shim is configured (devices, HBM, numerics) and its hooks installed before
the rename; ``torch.tpu`` must exist before anything imports torch.testing (OpInfo picks the
device up at import); Dynamo/Inductor are taken over lazily (tpusim/backend/device/dynamo_inductor.py); the
execution target is chosen last (tpusim/backend/targets/), once the shim it may listen to is in place.

``register()`` runs at import with the environment's config (tpusim/backend/plumbing/config.py ``load_config``);
``configure(config)`` (``tpusim.backend.configure``) applies a caller's config instead, while no
tensor lives on the device. The device's one eager-mode listener is here too: a change of
mode reaches debug mode first (tpusim/backend/dispatch/debug_mode.py), then the held target.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

from tpusim.backend import torchtpu
from tpusim.backend.aten import shape_functions
from tpusim.backend.device import dynamo_inductor, shutdown, tpu_module
from tpusim.backend.dispatch import debug_mode, fallback, rnn, tpu_numerics
from tpusim.backend.plumbing import shim
from tpusim.backend.plumbing.config import DeviceConfig, load_config
from tpusim.backend.plumbing.state import STATE
from tpusim.backend.program_trace import recorder
from tpusim.backend.targets import select
from tpusim.backend.targets.base import use
from tpusim.backend.torch_compile import jax_backend
from tpusim.eager import state as eager
from tpusim.errors import TpusimError
from tpusim.xla.compiler import quiet_libtpu

NAME = "tpu"


def register(config: DeviceConfig | None = None) -> None:
    """Make device "tpu" available in this process (idempotent), configured by ``config`` (default: the
    environment's, ``load_config()``)."""
    if STATE.shim is not None:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise RuntimeError(
            f"tpusim: the PrivateUse1 device is already claimed by {current!r} in this process, so \"tpu\" "
            f"cannot be registered. Import tpusim.backend before that backend, or do not load both.")
    quiet_libtpu()                               # jax, when it loads, must not greet a user with libtpu's warnings
    cfg = config or load_config()
    if cfg.eager_mode is None:                   # TPUSIM_EAGER_MODE=turbo: refused before any change, not after
        eager.mode_from_environment(os.environ)  # torch accepted "tpu" with no shim behind it (issue 44, NT5)
    target = select(cfg.target)                  # first: a target that cannot load fails before any change
    module = shim.load()
    _apply(module, cfg)
    if current != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    torch._register_device_module(NAME, tpu_module)
    torchtpu.install(tpu_module)                 # torch.tpu.distributed / .compiler / .ops, torch.backends.tpu
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                         for_packed_sequence=True, for_storage=True)
    torch.set_autocast_dtype(NAME, torch.bfloat16)
    fallback.install()
    recorder.install()
    dynamo_inductor.install()
    jax_backend.install()
    _register_c10d()
    shutdown.install(NAME)
    rnn.register()                                 # RNN layers outside a recording: CPU's own kernel
    shape_functions.register()                     # Meta kernels ATen lacks (CTC loss): shape-only runs
    if cfg.eager_mode is not None:
        eager.set_eager_mode(cfg.eager_mode)
    debug_mode.apply_mode(eager.get_eager_mode())  # TPUSIM_EAGER_MODE is checked here, at import
    STATE.shim = module
    use(target)
    eager.on_change(_mode_changed)


def configure(config: DeviceConfig) -> None:
    """Use ``config`` for the tpu device from now on (``tpusim.backend.configure``). Call it while no tensor
    lives on the device: registration at import used the environment (TPUSIM_*), and live memory cannot
    change chip, device count or numerics (once all of it is freed, it can: tests of several chips)."""
    if not isinstance(config, DeviceConfig):
        raise TpusimError(f"tpusim.backend.configure() takes a tpusim.backend.DeviceConfig, "
                          f"not {type(config).__name__}")
    if STATE.shim is None:                       # the autoload was off, or failed at `import torch`
        register(config)
        return
    if config != STATE.config:
        if _live():
            raise TpusimError("tpusim.backend.configure() must come while no tensor lives on the tpu device "
                              "(live memory was allocated with the config it was made with); call it right "
                              "after importing the backend or once its tensors are freed, or set the TPUSIM_* "
                              "variables before the program runs")
        _apply(STATE.shim, config)
    if config.eager_mode is not None:
        eager.set_eager_mode(config.eager_mode)      # the listener applies it to debug mode and the target
    if STATE.target.name != config.target:
        use(select(config.target))


def _apply(module: object, cfg: DeviceConfig) -> None:
    """Configure the shim and the process state for ``cfg``."""
    module.configure(cfg.device_count, cfg.hbm_bytes, not cfg.numerics, cfg.chip.name, cfg.chip.display_name)
    STATE.config = cfg
    STATE.numerics = cfg.numerics
    STATE.host_device = torch.device("cpu") if cfg.numerics else torch.device("meta")
    tpu_numerics.configure(cfg.tpu_numerics)     # --numerics tpu: contractions as a TPU computes them
    STATE.default_generators = tuple(module.default_generator(i) for i in range(cfg.device_count))


def _live() -> bool:
    """Whether any device memory is still allocated (after collecting garbage: tensors in dead cycles)."""
    def live() -> bool:
        return any(STATE.shim.stats(i)["live_blocks"] for i in range(STATE.shim.device_count()))
    if live():
        gc.collect()
    return live()


def _mode_changed(old: str, new: str) -> None:
    """tpusim.eager.state listener: debug mode applies the new mode and marks it in the trace, then the held
    target switches its execution (the PJRT target runs pending work first)."""
    debug_mode.on_change(old, new)
    STATE.target.on_mode_change(old, new)


C10D_NAMES = ("tpusim", "tpu_dist", "tpu")      # tpusim's name, then TorchTPU's two (its ProcessGroupTpu)


def _register_c10d() -> None:
    """Make "tpusim" the default c10d backend for "tpu" (``init_process_group()`` with no backend,
    ``init_device_mesh("tpu", ...)``), and TorchTPU's names "tpu_dist" and "tpu" the same backend, so
    ``init_process_group("tpu_dist")`` works under plain torchrun as under ``tpusim run``. Only the names
    are registered here; tpusim/backend/distributed/ is imported when the first process group is created, so
    importing the device stays cheap."""
    if not dist.is_available():
        return
    for name in C10D_NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _create_process_group, extended_api=True, devices=[NAME])


def _create_process_group(opts: object, backend_options: object) -> object:
    # Function-level: the c10d backend (and the launch-time patches its import installs) must not load
    # at `import torch`; it loads with the first process group.
    from tpusim.backend import distributed

    return distributed.TpusimProcessGroup(opts, backend_options)
