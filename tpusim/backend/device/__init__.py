"""The "tpu" device as torch sees it: registering PrivateUse1 as "tpu", ``torch.tpu``, Dynamo's and Inductor's
"tpu" entries, and the process's edges (exit, the measured run's worker).

Map: registration.py (``register`` at import, ``configure(config)``: wires every other room together),
tpu_module.py (``torch.tpu``), dynamo_inductor.py (takes over PyTorch's own "tpu" entries in Dynamo and
Inductor; torch.compile's backend itself is ../torch_compile/), shutdown.py (autograd's tpu threads let go
before Python finalizes), measure_worker.py (``python -m`` entry of ``tpusim run --target pjrt``'s real runs).
"""
