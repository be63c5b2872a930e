"""``torch_tpu._internal.utils.log_utils``: ``log_to_stderr`` (tpusim/backend/torchtpu/tracing.py)."""

from tpusim.backend.torchtpu.tracing import log_to_stderr

__all__ = ["log_to_stderr"]
