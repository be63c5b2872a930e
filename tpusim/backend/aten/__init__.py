"""ATen ops as the device reads and extends them, per op and without running anything on the device.

Map: op_schema.py (what an overload's schema says about its arguments: the one reader of ``op._schema``),
handwritten_kernels.py (ops whose CPU kernel is wrong or missing, one function each, run by the fallback),
shape_functions.py (the Meta kernels ATen lacks, for shape-only runs), flash_attention.py (the fused
``tpusim::attention`` ops and the rewrite that puts them in compiled graphs), float64_policy.py (float64 and
complex: what a TPU cannot run natively, warned about or refused).
"""
