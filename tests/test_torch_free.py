"""The simulator layer never imports torch (DESIGN.md): every tpusim module but the backend and the
run command imports in a fresh interpreter without loading torch."""

import subprocess
import sys

CODE = """
import importlib, sys
from pathlib import Path
import tpusim
skipped = ("tpusim.backend", "tpusim.cli.run", "tpusim.__main__")
root = Path(tpusim.__file__).parent
found = (("tpusim",) + p.relative_to(root).with_suffix("").parts for p in sorted(root.rglob("*.py")))
names = [".".join(parts[:-1] if parts[-1] == "__init__" else parts) for parts in found]
names = [n for n in names if not any(n == s or n.startswith(s + ".") for s in skipped)]
for name in names:
    importlib.import_module(name)
    if "torch" in sys.modules:
        raise SystemExit(f"importing {name} imported torch")
print(len(names))
"""


def test_no_simulator_module_imports_torch():
    # TORCH_DEVICE_BACKEND_AUTOLOAD does not matter here: nothing may import torch at all
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split()[-1]) > 40       # the walk really found the simulator's modules
