"""The shim is compiled as a few build units, each including several of csrc/'s files (issue 31, item 3).

Why a test: a .cpp file added to csrc/ but to no unit would silently never be compiled (its kernels missing
at run time), and one in two units would fail to link only on a fresh build.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tpusim.backend.plumbing import shim


def _included(unit: str) -> list[str]:
    return re.findall(r'^#include "([^"]+\.cpp)"', (shim.CSRC / unit).read_text(), flags=re.MULTILINE)


def test_every_source_file_is_compiled_by_exactly_one_unit() -> None:
    sources = sorted(p.name for p in shim.CSRC.glob("*.cpp") if p.name not in shim.UNITS)
    included = sorted(name for unit in shim.UNITS for name in _included(unit))
    assert included == sources


def test_the_build_is_keyed_by_every_file_in_csrc(tmp_path, monkeypatch) -> None:
    for path in shim.CSRC.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(shim, "CSRC", tmp_path)
    before = shim._digest()
    header = tmp_path / "tpu_shim.h"
    header.write_text(header.read_text() + "\n// edited\n")
    assert shim._digest() != before


def test_a_cache_folder_that_cannot_be_written_falls_back_to_the_temporary_folder(capsys) -> None:
    # Issue 32, row 9: a read-only home made `import torch` fail with a raw PermissionError (no shim cache).
    # /dev/null/... cannot be created by anyone, root included.
    wanted = Path("/dev/null/tpusim/shim-test")
    got = shim._writable(wanted)
    assert got.is_dir() and got.name == "shim-test" and str(got).startswith(tempfile.gettempdir())
    assert "cannot write the shim cache /dev/null/tpusim" in capsys.readouterr().err


def test_the_build_keeps_cpp_extensions_cuda_note_from_a_new_user(caplog) -> None:
    # From PyPI, torch 2.13.0 brings CUDA's libraries; on a machine without a GPU, importing cpp_extension for
    # the shim's build warned "No CUDA runtime is found, using CUDA_HOME='/usr/local'" in a new user's first run.
    import logging

    log = logging.getLogger("torch.utils.cpp_extension")
    log.addFilter(shim._no_cuda_note)
    try:
        with caplog.at_level(logging.WARNING, logger=log.name):
            log.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
            log.warning("another warning")
    finally:
        log.removeFilter(shim._no_cuda_note)
    assert [r.getMessage() for r in caplog.records] == ["another warning"]
