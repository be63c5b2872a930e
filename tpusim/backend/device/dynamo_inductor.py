"""Take over PyTorch's own "tpu" entries in Dynamo and Inductor.

PyTorch 2.13 ships a Dynamo ``TpuInterface`` and an Inductor Pallas route for a device named
"tpu", both written for Google's unreleased ``torch_tpu`` package (generated code imports it).
Ours replace them: the device interface reports our devices, streams and properties; Inductor
compiles "tpu" graphs with its C++ CPU scheduling, since device memory is host memory (as in
PyTorch's OpenReg). Both modules are heavy to import, so the takeover runs when (and if) the
program imports them, through a post-import hook (tpusim/backend/plumbing/import_hooks.py), and never costs
anything otherwise.
"""

from __future__ import annotations

from types import ModuleType

import torch

from tpusim.backend.device import tpu_module as tpu
from tpusim.backend.plumbing.import_hooks import after_import

_DYNAMO = "torch._dynamo.device_interface"
_INDUCTOR = "torch._inductor.codegen.common"


def install() -> None:
    after_import(_DYNAMO, _take_over_dynamo)
    after_import(_INDUCTOR, _take_over_inductor)


def _take_over_dynamo(mod: ModuleType) -> None:
    class TpusimInterface(mod.DeviceInterface):
        device = tpu.device
        Event = tpu.Event
        Stream = tpu.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                tpu.set_device(device)

            @staticmethod
            def current_device() -> int:
                return tpu.current_device()

            @staticmethod
            def get_device_properties(device: object = None) -> object:
                return tpu.get_device_properties(device)

        current_device = staticmethod(tpu.current_device)
        set_device = staticmethod(tpu.set_device)
        device_count = staticmethod(tpu.device_count)
        is_available = staticmethod(tpu.is_available)
        stream = staticmethod(tpu.stream)
        current_stream = staticmethod(tpu.current_stream)
        set_stream = staticmethod(tpu.set_stream)
        synchronize = staticmethod(tpu.synchronize)
        memory_allocated = staticmethod(tpu.memory_allocated)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            prev = tpu.current_device()
            tpu.set_device(device)
            return prev

        exchange_device = maybe_exchange_device

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            tpu.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0

        @classmethod
        def get_device_properties(cls, device: object = None) -> object:
            return tpu.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device: object = None) -> str:
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def is_triton_capable(device: object = None) -> bool:
            return False

    mod.get_registered_device_interfaces()       # runs PyTorch's init, which registers its own "tpu"
    mod.register_interface_for_device("tpu", TpusimInterface)
    for i in range(tpu.device_count()):
        mod.register_interface_for_device(f"tpu:{i}", TpusimInterface)


class _WrapperCodegen:
    """Inductor's Python wrapper, with "tpu" kernels called as CPU kernels (host memory)."""

    _cls: type | None = None
    supports_caching = False     # Inductor asks before caching a graph (torch 2.13): tpu graphs are compiled afresh

    @classmethod
    def _real(cls) -> type:
        if cls._cls is None:
            # Function-level: Inductor is heavy (seconds); this runs only once a program uses it.
            from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

            class TpusimWrapperCodegen(PythonWrapperCodegen):
                @staticmethod
                def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: object,
                           partition_signatures: object = None) -> object:
                    if is_subgraph:
                        return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
                    return TpusimWrapperCodegen()

                def _generate_kernel_call_helper(self, kernel_name: str, call_args: list, *,
                                                 device: object = None, **kwargs: object) -> None:
                    from torch._inductor.virtualized import V  # Inductor is loaded here already

                    device = device or V.graph.get_current_device_or_throw()
                    if device.type == "tpu":
                        device = torch.device("cpu")
                    super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)

            cls._cls = TpusimWrapperCodegen
        return cls._cls

    @staticmethod
    def create(*args: object, **kwargs: object) -> object:
        return _WrapperCodegen._real().create(*args, **kwargs)


def _cpp_scheduling(scheduler: object) -> object:
    from torch._inductor.codegen.cpp import CppScheduling  # Inductor: heavy, loaded only by programs using it

    return CppScheduling(scheduler)


def _take_over_inductor(mod: ModuleType) -> None:
    mod.register_backend_for_device("tpu", _cpp_scheduling, _WrapperCodegen)
