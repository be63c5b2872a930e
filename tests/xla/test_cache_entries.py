"""The TPU compiler's disk cache (tpusim/xla/compiler.py) when an entry is damaged, edited or not a file (issue 44,
rows XC_null, XC_list, XC_hlotype, XC_emptyhlo, XC_garbagehlo, XC_fifo, XC_bigcycles): each is ignored, the module
compiled again and the entry replaced; no entry stops a run. No compile here: the worker is replaced by a fake
that says what it was asked, and the versions in the cache key are fixed, so these run without the xla extra."""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from tpusim.xla import compiler, programs
from tpusim.xla.compiler import XlaTarget, XlaUnavailable

TARGET = XlaTarget("v5e", "v5e:1x1", 1, 1.5e9)
MODULE = "module @m { func.func public @main() { return } }"
HLO = """HloModule m, entry_computation_layout={()->f32[]}

ENTRY %main () -> f32[] {
  ROOT %c = f32[] constant(1), metadata={}
}
"""
RESULT = {"hlo": HLO, "memory": {"peak_memory_in_bytes": 64}, "cost": {"flops": 2.0}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of its own (never the shared ~/.cache/tpusim) and a worker that counts its compiles."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(compiler, "versions", lambda: "jax 0, jaxlib 0, libtpu 0")
    monkeypatch.setattr(compiler, "missing", lambda: None)
    compiles = []

    def worker(self, text, target, timeout_s):
        compiles.append(text)
        return RESULT, 0.5

    monkeypatch.setattr(compiler._Worker, "compile", worker)
    return compiles


def entry() -> os.PathLike:
    return compiler._cache_file(MODULE, TARGET)


def test_a_kept_entry_is_read_back_without_a_compile(cache):
    first = compiler.compile_stablehlo(MODULE, TARGET)
    again = compiler.compile_stablehlo(MODULE, TARGET)
    assert len(cache) == 1 and not first.cached and again.cached
    assert (again.hlo, again.memory, again.cost, again.compile_s) == (HLO, {"peak_memory_in_bytes": 64},
                                                                     {"flops": 2.0}, 0.5)


def signed(payload: bytes) -> bytes:
    """An entry as tpusim writes it: the payload's sha256, a newline, the payload."""
    return hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


BAD = {
    "null, as the red team wrote it": b"null",
    "a list, as the red team wrote it": b"[1, 2]",
    "hlo a number, unsigned": json.dumps({"hlo": 5, "memory": "x", "cost": {}, "compile_s": 1}).encode(),
    "null": signed(b"null"),
    "a list": signed(b"[1, 2]"),
    "hlo a number": signed(json.dumps({"hlo": 5, "memory": "x", "cost": {}, "compile_s": 1}).encode()),
    "empty hlo": signed(json.dumps({**RESULT, "hlo": "", "compile_s": 1}).encode()),
    "memory a string": signed(json.dumps({**RESULT, "memory": "x", "compile_s": 1}).encode()),
    "no compile_s": signed(json.dumps(RESULT).encode()),
    "cut short": signed(json.dumps({**RESULT, "compile_s": 1}).encode())[:100],
    "unsigned (plain JSON)": json.dumps({**RESULT, "compile_s": 1}).encode(),
    "binary": bytes(range(256)) * 8,
    "empty": b"",
}


@pytest.mark.parametrize("name", BAD)
def test_a_damaged_entry_is_compiled_again_and_replaced(cache, name):
    compiler.compile_stablehlo(MODULE, TARGET)
    entry().write_bytes(BAD[name])
    found = compiler.compile_stablehlo(MODULE, TARGET)
    assert len(cache) == 2 and not found.cached and found.hlo == HLO
    assert compiler.compile_stablehlo(MODULE, TARGET).cached       # the bad entry was replaced by a good one
    assert len(cache) == 2


def test_an_edited_entry_is_never_believed(cache):
    # XC_bigcycles: XLA's estimated cycles x 1e6 in a cached entry turned XLA's 7.8 us into 7.8 s, silently.
    compiler.compile_stablehlo(MODULE, TARGET)
    digest, _, payload = entry().read_bytes().partition(b"\n")
    entry().write_bytes(digest + b"\n" + payload.replace(b'"flops": 2.0', b'"flops": 2000000.0'))
    found = compiler.compile_stablehlo(MODULE, TARGET)
    assert len(cache) == 2 and found.cost == {"flops": 2.0}


def test_a_fifo_at_an_entry_name_is_not_read(cache):
    # XC_fifo: read_text() on a FIFO blocked for ever (no writer).
    entry().parent.mkdir(parents=True)
    os.mkfifo(entry())
    found = []
    reader = threading.Thread(target=lambda: found.append(compiler.compile_stablehlo(MODULE, TARGET)), daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "reading the cache blocked on a FIFO"
    assert len(cache) == 1 and found[0].hlo == HLO


def test_a_folder_at_an_entry_name_is_compiled_not_kept(cache):
    entry().mkdir(parents=True)
    assert not compiler.compile_stablehlo(MODULE, TARGET).cached
    assert not compiler.compile_stablehlo(MODULE, TARGET).cached and len(cache) == 2


@pytest.mark.parametrize("hlo", ["", "HloModule m\n\n%f () -> f32[] {\n}\n", "ENTRY"])
def test_xlas_program_that_does_not_parse_falls_back_with_its_reason(hlo):
    # XC_emptyhlo, XC_garbagehlo: the parser's ValueError stopped the run after the script ran.
    with pytest.raises(XlaUnavailable, match="XLA's program could not be read"):
        programs.read_program(hlo)


def test_one_small_program_that_does_not_parse_leaves_the_others_compiled(monkeypatch):
    bad = compiler.Compiled("not HLO", {}, {}, 0.0)
    good = compiler.Compiled(HLO, {}, {}, 0.0)
    monkeypatch.setattr(programs, "compile_many", lambda texts, target: [bad, good])
    first, second = programs._compile_small(["a", "b"], TARGET)
    assert isinstance(first, XlaUnavailable) and "could not be read" in str(first)
    assert isinstance(second, programs.OpEstimate)
