"""The TPU compiler's pool of worker processes (tpusim/xla/compiler.py ``compile_all``, issue 41 item 4): each
distinct uncached module compiled once, on several long-lived workers at once; a worker that dies on one module
(libtpu aborts on some), or runs past its time, costs that module only, and the others still compile.

No jax here: the worker is a fake that answers as ``tpusim.xla.worker --serve`` does (one JSON line per request
line), with an HLO text that names the module it was given (so an answer can be told from another's), its
process id, and a line in a log for each process start; ABORT in a module aborts the process as libtpu does,
REFUSE is refused with a reason, HANG never answers."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from tpusim.xla import compiler
from tpusim.xla.compiler import Compiled, XlaTarget, XlaUnavailable, compile_all

TARGET = XlaTarget("v5e", "v5e:1x1", 1, 1.5e9)
FAKE = """
import json, os, sys, time
log = sys.argv[1]
with open(log, "a") as f:
    f.write(f"start {os.getpid()}\\n")
for line in sys.stdin:
    text = json.loads(line)["text"]
    if "ABORT" in text:
        print("F0000 libtpu: Check failed: the module is not one I take", file=sys.stderr, flush=True)
        os.abort()
    if "HANG" in text:
        time.sleep(3600)
    if "REFUSE" in text:
        answer = {"error": "UNIMPLEMENTED: an op it has no lowering for"}
    else:
        time.sleep(0.05)
        answer = {"hlo": f"HloModule m\\n// {text} by {os.getpid()}\\nENTRY %main () -> f32[] {{\\n}}\\n",
                  "memory": {"peak_memory_in_bytes": len(text)}, "cost": {"flops": 1.0}}
    print(json.dumps(answer), flush=True)
"""


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    """A cache of its own, fixed versions, and the fake worker; returns the log of worker starts."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "versions", lambda: "jax 0, jaxlib 0, libtpu 0")
    monkeypatch.setattr(compiler, "missing", lambda: None)
    script, log = tmp_path / "fake_worker.py", tmp_path / "starts.log"
    script.write_text(FAKE)
    log.touch()
    monkeypatch.setattr(compiler, "WORKER_COMMAND", [sys.executable, str(script), str(log)])
    return log


def starts(log: Path) -> list[str]:
    return log.read_text().split()[1::2]


def served_by(result: Compiled) -> tuple[str, str]:
    """The module the fake compiled and its process, from the HLO it answered."""
    _, _, rest = result.hlo.splitlines()[1].partition("// ")
    text, _, pid = rest.rpartition(" by ")
    return text, pid


def test_many_modules_share_a_few_worker_processes_and_each_gets_its_own_answer(fake):
    texts = [f"module {i}" for i in range(12)]
    heard: list[tuple[int, int]] = []
    results = compile_all([(t, TARGET) for t in texts], workers=3, progress=lambda d, n: heard.append((d, n)))
    assert [served_by(r)[0] for r in results] == texts           # no answer crossed to another module
    pids = {served_by(r)[1] for r in results}
    assert len(starts(fake)) == 3 and pids == set(starts(fake))   # 12 modules, 3 process starts, all 3 used
    assert heard == [(i, 12) for i in range(13)]


def test_a_module_that_aborts_its_worker_costs_that_module_only(fake):
    texts = ["module a", "module ABORT", "module b", "module REFUSE", "module c", "module d"]
    results = compile_all([(t, TARGET) for t in texts], workers=2)
    aborted, refused = results[1], results[3]
    assert isinstance(aborted, XlaUnavailable)
    assert "exit -6" in str(aborted) and "Check failed: the module is not one I take" in str(aborted)
    assert isinstance(refused, XlaUnavailable) and "refused the program: UNIMPLEMENTED" in str(refused)
    others = [r for i, r in enumerate(results) if i not in (1, 3)]
    assert [served_by(r)[0] for r in others] == ["module a", "module b", "module c", "module d"]
    assert len(starts(fake)) <= 3                                 # the aborted worker was replaced once at most


def test_a_module_past_its_time_is_ended_and_the_others_compile(fake):
    results = compile_all([(t, TARGET) for t in ("module HANG", "module a", "module b")], workers=1, timeout_s=2)
    assert isinstance(results[0], XlaUnavailable) and "ran past 2 s" in str(results[0])
    assert [served_by(r)[0] for r in results[1:]] == ["module a", "module b"]


def test_a_second_call_compiles_nothing_and_one_module_asked_twice_compiles_once(fake):
    texts = ["module a", "module b", "module a"]
    first = compile_all([(t, TARGET) for t in texts], workers=2)
    assert len({served_by(r)[1] for r in first}) <= 2 and first[0] == first[2]
    assert not any(r.cached for r in first)
    before = len(starts(fake))
    heard: list[tuple[int, int]] = []
    again = compile_all([(t, TARGET) for t in texts], workers=2, progress=lambda d, n: heard.append((d, n)))
    assert all(r.cached for r in again) and [r.hlo for r in again] == [r.hlo for r in first]
    assert len(starts(fake)) == before and heard == []           # no worker started, nothing to count


def test_the_worker_answers_each_request_line_with_one_line_even_one_it_cannot_compile(tmp_path):
    from tpusim.xla import worker

    requests = tmp_path / "requests.jsonl"
    requests.write_text(json.dumps({"text": "not stablehlo", "topology": "nowhere:1x1", "partitions": 1}) + "\n"
                        + "\n" + json.dumps({"text": "x", "topology": "nowhere:1x1", "partitions": 1}) + "\n")
    answers = tmp_path / "answers.jsonl"
    with requests.open() as into, answers.open("w") as out:
        worker.serve(into, out)
    lines = answers.read_text().splitlines()
    assert len(lines) == 2 and all("error" in json.loads(line) for line in lines)


@pytest.mark.parametrize("tty", [True, False])
def test_a_run_counts_the_compiles_and_says_nothing_when_quiet(tty):
    from tpusim.run.progress import Progress
    from tpusim.xla.programs import compile_progress

    stream, quiet = io.StringIO(), io.StringIO()
    for progress in (Progress(quiet=False, stream=stream, tty=tty), Progress(quiet=True, stream=quiet, tty=tty)):
        report = compile_progress(progress)
        for done in range(4):
            report(done, 3)
    text = stream.getvalue()
    assert text.startswith("tpusim: XLA: compiling 3 programs on ") and "tpusim: XLA: compiled 3 programs in " in text
    assert ("XLA: compiling 2 of 3 programs..." in text) == tty      # the counted line is drawn on a terminal only
    assert quiet.getvalue() == ""


HLO = ("HloModule m, entry_computation_layout={()->f32[]}\n\n"
       "ENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n")


@pytest.mark.parametrize("whole_compiles", [True, False])
def test_a_graphs_segments_are_compiled_only_when_its_whole_graph_fails(monkeypatch, whole_compiles):
    from tpusim.hardware.spec import load_chip
    from tpusim.trace.records import Trace, TraceMeta, XlaModule
    from tpusim.xla import programs

    whole = XlaModule("graph 0 (forward)", "WHOLE", programs=(0, 2), devices=4, segments=2)
    segments = [XlaModule("graph 0 (forward)", f"SEGMENT {n}", programs=(n, n + 2)) for n in (0, 1)]
    asked: list[list[tuple[str, int]]] = []

    def fake_compile_all(jobs, *, workers=None, progress=None):
        asked.append([(text, target.partitions) for text, target in jobs])
        return [XlaUnavailable("refused: a collective over two groups") if text == "WHOLE" and not whole_compiles
                else Compiled(HLO, {}, {}, 0.1) for text, _ in jobs]

    monkeypatch.setattr(programs, "compile_all", fake_compile_all)
    trace = Trace(records=(), meta=TraceMeta(xla_modules=(*segments, whole)))
    xla = programs.estimate_programs(trace, load_chip("v5e"))
    if whole_compiles:
        assert asked == [[("WHOLE", 4)]]                             # the segments never compile
        assert [p.devices for p in xla.compiled] == [4] and xla.compiled[0].executions == (0, 1, 2, 3)
        assert xla.fell_back == ()
    else:
        assert asked == [[("WHOLE", 4)], [("SEGMENT 0", 1), ("SEGMENT 1", 1)]]
        assert [p.programs for p in xla.compiled] == [(0, 2), (1, 3)]
        assert xla.fell_back == ("graph 0 (forward): refused: a collective over two groups (its segments are "
                                 "compiled one by one)",)
