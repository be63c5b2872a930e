"""What every other room of the backend reads, and nothing of the backend besides: the device's settings and
process state, the C++ shim's loader, the user's source line, and hook plumbing.

Map: config.py (the typed ``DeviceConfig``; TPUSIM_* variables), state.py (process state, the held target),
shim.py (compiles and loads csrc/), source.py (the user's line for a record), import_hooks.py (run a function
when a heavy module is imported), native_hooks.py (fans out the shim's ``.item()``/copy events).
"""
