"""TorchTPU names that cannot mean anything without hardware, or that tpusim does not model yet.

Each exists (``hasattr`` is true, ``from torch.tpu.ops import send`` works) and raises a ``TpusimError``
naming itself and why when called, so a script fails at the line that needs a TPU with a reason,
not with an ``AttributeError`` at import. Adding such a name = one row of ``UNSUPPORTED``.
"""

from __future__ import annotations

from collections.abc import Callable

from tpusim.errors import TpusimError

# (module, name) -> why it does not run here
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("torch.tpu", "_set_cache_only"): "cache-only mode refuses XLA compilations, and the simulator compiles "
                                      "nothing it could refuse (the report prices compiles instead)",
    ("torch.tpu.ops", "send"): "it is a one-sided DMA between TPU devices (WindowTpu); use torch.distributed.send",
    ("torch.tpu.ops", "recv"): "it is a one-sided DMA between TPU devices (WindowTpu); use torch.distributed.recv",
    ("torch.tpu.ops", "all_gather_dim"): "its signature is not in TorchTPU's public source; use "
                                         "torch.distributed.all_gather_into_tensor",
    ("torch.tpu.ops", "reduce_scatter_dim"): "its signature is not in TorchTPU's public source; use "
                                             "torch.distributed.reduce_scatter_tensor",
    ("torch.tpu.ops", "max_pool2d"): "its signature is not in TorchTPU's public source; use "
                                     "torch.nn.functional.max_pool2d (it runs on tpu)",
    ("torch_tpu.api", "_xla_cuda_device"): "it is TorchTPU's XLA backend on an NVIDIA GPU; tpusim simulates TPUs: "
                                           "use api.tpu_device()",
    ("torch_tpu.api", "_xla_cpu_device"): "it is TorchTPU's XLA backend on the host CPU; tpusim simulates TPUs: "
                                          "use api.tpu_device()",
}


def stand_in(module: str, name: str) -> Callable[..., object] | None:
    """A stand-in for ``module.name`` that raises a TpusimError when called, or None when the name is not
    a row of ``UNSUPPORTED`` (the module's ``__getattr__`` then raises AttributeError as usual)."""
    why = UNSUPPORTED.get((module, name))
    if why is None:
        return None

    def raise_unsupported(*args: object, **kwargs: object) -> object:
        raise TpusimError(f"{module}.{name}() does not run on tpusim: {why}")

    raise_unsupported.__name__ = raise_unsupported.__qualname__ = name
    raise_unsupported.__doc__ = f"TorchTPU's {module}.{name}: not on tpusim ({why})."
    return raise_unsupported


def module_getattr(module: str) -> Callable[[str], object]:
    """A module ``__getattr__`` that serves ``module``'s rows of ``UNSUPPORTED``."""

    def __getattr__(name: str) -> object:
        found = stand_in(module, name)
        if found is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return found

    return __getattr__
