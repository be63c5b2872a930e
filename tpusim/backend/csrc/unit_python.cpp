// Build unit 2 of 2: the fallback into Python, the recorder and the Python bindings (see unit_aten.cpp for why
// the shim is built as two units).
#include "fallback.cpp"
#include "record.cpp"
#include "module.cpp"
