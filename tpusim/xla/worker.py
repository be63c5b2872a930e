"""``python -m tpusim.xla.worker --serve``: deviceless compiles, one after another, in a process of its own.

Each line read on stdin is a request (JSON): {"text": StableHLO module text, "topology": "v5p:2x2x1",
"partitions": 1}; each is answered by one line (JSON) on stdout: {"hlo": the optimized HLO text, "memory": the
compiled memory stats, "cost": XLA's cost analysis}, or {"error": why} for a module the compiler refused. One
process serves many modules: jax and libtpu start once (about 2 s), not once per module. Anything else written
to stdout (libtpu's own prints) goes to stderr, so the answers stay one line each. The process ends at the end
of stdin. ``python -m tpusim.xla.worker REQUEST RESULT`` compiles one request file into a result file. The
parent (compiler.py) sets the environment that keeps libtpu quiet and offline before this imports jax.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import TextIO

MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes", "peak_memory_in_bytes")


@functools.cache
def _devices(topology: str) -> list:
    """The virtual slice's devices (asked of libtpu once per topology and process)."""
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(topology, "tpu").devices)


def compile_module(text: str, topology: str, partitions: int) -> dict:
    """XLA's program for ``text`` on the first ``partitions`` devices of the virtual ``topology``."""
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    devices = _devices(topology)[:partitions]
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


def answer(request: dict) -> dict:
    """The module's result, or {"error": why} when the compiler refuses it (the process serves the next one)."""
    try:
        return compile_module(request["text"], request["topology"], int(request["partitions"]))
    except Exception as error:  # jax's JaxRuntimeError and friends: this module only
        text = str(error).strip()
        return {"error": text.splitlines()[-1][:300] if text else type(error).__name__}


def serve(requests: TextIO, answers: TextIO) -> None:
    """Answer each request line with one result line, until the end of ``requests``."""
    for line in requests:
        if line.strip():
            answers.write(json.dumps(answer(json.loads(line))) + "\n")
            answers.flush()


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        answers = os.fdopen(os.dup(1), "w")   # the answers' own copy of stdout; fd 1 itself now goes to stderr
        os.dup2(2, 1)
        serve(sys.stdin, answers)
        return 0
    request_path, result_path = argv
    with open(request_path) as file:
        result = answer(json.load(file))
    with open(result_path, "w") as file:
        json.dump(result, file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
