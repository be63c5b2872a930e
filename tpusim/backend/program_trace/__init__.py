"""Recording the program trace (``tpusim.trace.records``) while a tpu program runs.

Map: recorder.py (``recording()``: ops, host syncs, memory and steps into a ``Trace``), costs.py (torch tensors
as the metadata the shared cost rules read), compiled_program.py (a torch.compile'd graph as a priced op list,
replayed into the trace at every run), op_programs.py (each distinct eager op as a one-op program for the TPU
compiler), phases.py (``phase("prefill")``: inference phases the script marks).
"""
