"""``torch_tpu.profiler``: the same names as ``torch_tpu._internal.profiler`` (tpusim/backend/torchtpu/profiler.py)."""

from torch_tpu._internal.profiler import ProfilerActivity, profile, register_kineto_backend, xprof_trace_handler

__all__ = ["ProfilerActivity", "profile", "register_kineto_backend", "xprof_trace_handler"]
