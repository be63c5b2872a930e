"""``python -m tpusim.xla.worker REQUEST RESULT``: one deviceless compile, in a process of its own.

REQUEST (JSON): {"text": StableHLO module text, "topology": "v5p:2x2x1", "partitions": 1}. RESULT (JSON):
{"hlo": the optimized HLO text, "memory": the compiled memory stats, "cost": XLA's cost analysis}. With
"texts" (a list) in place of "text": {"results": [one such result, or {"error": why}, per module]}. The
parent (compiler.py) sets the environment that keeps libtpu quiet and offline before this imports jax.
"""

from __future__ import annotations

import json
import sys

MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes", "peak_memory_in_bytes")


def compile_module(text: str, topology: str, partitions: int) -> dict:
    """XLA's program for ``text`` on the first ``partitions`` devices of the virtual ``topology``."""
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax.experimental import topologies

    devices = list(topologies.get_topology_desc(topology, "tpu").devices)[:partitions]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=partitions,
                                           device_assignment=np.array(devices, dtype=object).reshape(1, partitions))
    with mlir.make_ir_context():
        module = mlir.ir.Module.parse(text)
    executable = devices[0].client.compile(module, executable_devices=_jax.DeviceList(tuple(devices)),
                                           compile_options=options)
    stats = executable.get_compiled_memory_stats()
    cost = executable.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else cost
    return {"hlo": "\n\n".join(m.to_string() for m in executable.hlo_modules()),
            "memory": {name: int(getattr(stats, name)) for name in MEMORY_FIELDS if hasattr(stats, name)},
            "cost": {name: float(value) for name, value in dict(cost).items()}}


def compile_each(texts: list[str], topology: str, partitions: int) -> list[dict]:
    """Each module's result, or {"error": why} for one the compiler refuses (the others still compile)."""
    results = []
    for text in texts:
        try:
            results.append(compile_module(text, topology, partitions))
        except Exception as error:  # jax's JaxRuntimeError and friends: this module only
            results.append({"error": str(error).strip().splitlines()[-1][:300] if str(error).strip() else
                            type(error).__name__})
    return results


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path) as file:
        request = json.load(file)
    topology, partitions = request["topology"], int(request["partitions"])
    if "texts" in request:                   # many one-op programs: one process, one libtpu start
        result: dict = {"results": compile_each(request["texts"], topology, partitions)}
    else:
        result = compile_module(request["text"], topology, partitions)
    with open(result_path, "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
