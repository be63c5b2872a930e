"""Execution targets of the tpu device: ``sim`` (the default: CPU kernels on host memory, in
backend/fallback.py) and ``pjrt`` (pjrt.py: ops run through the ATen -> JAX lowering table)."""
