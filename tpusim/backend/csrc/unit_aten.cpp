// Build unit 1 of 2: the device's kernels on ATen (no Python). The shim is built as two units, not one per file:
// every translation unit re-parses torch's headers, which is most of the build (8 units cost about 150 s of CPU,
// these 2 about 55 s, and they compile side by side). tpusim/backend/plumbing/shim.py compiles this and unit_python.cpp.
#include "runtime.cpp"
#include "kernels.cpp"
#include "autocast.cpp"
#include "attention.cpp"
#include "ddp_timer.cpp"
#include "compile_cache.cpp"
