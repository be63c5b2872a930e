"""tpusim: a simulator-first TPU emulator and PyTorch backend testbed.

This package is the simulator layer: it never imports torch (see DESIGN.md).
The PyTorch "tpu" device lives in ``tpusim.backend`` (top-level folder backend/).
"""

__version__ = "0.1.0"
