"""``torch_tpu._internal.profiler``: ``profile``, ``ProfilerActivity``, ``xprof_trace_handler``
(tpusim/backend/torchtpu/profiler.py).

The handler's folder gets torch.profiler's Chrome trace of the block and, under ``tpusim run``, the block
priced on a simulated chip (Perfetto format) where TorchTPU writes XProf's ``.xplane.pb``.
"""

from tpusim.backend.torchtpu.profiler import ProfilerActivity, profile, xprof_trace_handler


def register_kineto_backend() -> None:
    """TorchTPU's explicit Kineto registration: nothing to register (the host profiler is torch's own)."""


__all__ = ["ProfilerActivity", "profile", "register_kineto_backend", "xprof_trace_handler"]
