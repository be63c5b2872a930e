"""Test groups by what a test needs, as markers a user can select (``pytest -m sim``):

- ``sim``: the torch-free simulator (tests/*.py except those listed in ``DEVICE_FILES``);
- ``device``: the PyTorch "tpu" device (tests/backend/, and top-level tests that run scripts);
- ``jax``: the PJRT target and torch.compile through JAX (tests/pjrt/, the ``pjrt`` extra);
- ``distributed``: torch.distributed across processes (tests/distributed/);
- ``accelerator``: a real TPU or GPU seen by JAX (tests/tpu/, skipped elsewhere);
- ``xla``: the real TPU compiler, deviceless (tests/xla/, the ``xla`` extra; skipped without it);
- ``slow``: long runs, excluded by default (``-m slow`` runs them).

Adding a test folder = one row in ``GROUP_BY_FOLDER``. Shared builders live in tests/factories.py.
"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # tests/factories.py

GROUP_BY_FOLDER = {"backend": "device", "pjrt": "jax", "distributed": "distributed", "tpu": "accelerator",
                   "report": "sim", "xla": "xla"}
DEVICE_FILES = {"test_run.py", "test_notebook.py", "test_packaging.py",
                "test_run_outcomes.py"}   # top-level tests that run the device


def group_of(path: Path) -> str:
    relative = path.relative_to(HERE)
    if len(relative.parts) > 1:
        return GROUP_BY_FOLDER[relative.parts[0]]
    return "device" if relative.name in DEVICE_FILES else "sim"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(group_of(Path(str(item.path))))
