"""``torch_tpu._internal.distributed.multiprocessing``: ``handle_main``, ``handle_test_main``, ``get_context``
(tpusim/backend/torchtpu/launchers.py)."""

from tpusim.backend.torchtpu.launchers import get_context, handle_main, handle_test_main

__all__ = ["get_context", "handle_main", "handle_test_main"]
