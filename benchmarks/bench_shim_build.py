"""The shim's first build: one unit per source file vs the build units shim.py compiles, side by side.

    python benchmarks/bench_shim_build.py

Each way builds from scratch in its own temporary folder, in a child process (so the CPU time of the
compiler processes is measured); same machine, same run. Target (issue 31): under a minute of CPU.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from tpusim.backend.plumbing import shim

_BUILD = """
import sys
from torch.utils import cpp_extension
cpp_extension.load(name="bench_shim", sources=sys.argv[3:], extra_include_paths=[sys.argv[1]],
                   extra_cflags=["-O2", "-Wno-unused-parameter"], build_directory=sys.argv[2], verbose=False)
"""


def _build(sources: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one build from scratch."""
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", _BUILD, str(shim.CSRC), folder, *sources], check=True,
                       cwd=folder, stdout=subprocess.DEVNULL,
                       env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})   # else tpusim's own shim loads too
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    per_file = sorted(str(p) for p in shim.CSRC.glob("*.cpp") if p.name not in shim.UNITS)
    units = [str(shim.CSRC / unit) for unit in shim.UNITS]
    rows = [("one unit per file", len(per_file), *_build(per_file)),
            ("shim.py's units", len(units), *_build(units))]
    print(f"{'build':<20} {'units':>5} {'wall s':>8} {'CPU s':>8}")
    for name, count, wall, cpu in rows:
        print(f"{name:<20} {count:>5} {wall:>8.1f} {cpu:>8.1f}")
    print(f"units / per file: wall {rows[1][2] / rows[0][2]:.2f}x, CPU {rows[1][3] / rows[0][3]:.2f}x")


if __name__ == "__main__":
    main()
