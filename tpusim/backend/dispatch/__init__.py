"""How an eager ATen op on tpu tensors runs: PrivateUse1's boxed fallback and what it calls at each op.

Map: fallback.py (the one boxed fallback: the CPU kernel on host aliases, results mapped back, the op recorded),
tpu_numerics.py (``--numerics tpu``: contractions in the MXU's bf16 passes), debug_mode.py (the debug eager
mode's NaN/Inf check at the op), offload.py (which device->host copies keep an activation), rnn.py (RNN layers
as CPU's own kernel outside a recording), dispatch_mode.py (the base of tpusim's dispatch modes).
"""
