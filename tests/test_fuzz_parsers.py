"""Property-based tests (hypothesis) of everything that reads user input or files: whatever text or bytes
come in, a parser returns its value or raises TpusimError, never another exception, and what it accepts
is what the grammar says. Small ``max_examples`` keep the file to a few seconds."""

import dataclasses
import json
import math
import re

import pytest
from factories import training_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpusim import envvars
from tpusim.cli import compare
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError, plain_text
from tpusim.hardware.spec import chips_dir, load_chip
from tpusim.placement.parse import parse_placement_text
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, report_json
from tpusim.report.load import check_report
from tpusim.slice.topology import MAX_SLICES, build_slice, parse_chip_name, parse_slices, parse_topology
from tpusim.trace.records import read_trace, write_trace
from tpusim.units import MAX_BYTES, parse_bytes

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ANY_TEXT = st.text(max_size=40) | st.text(alphabet="0123456789xdD:., \t\n٨٣eEkKMGiBb+-", max_size=40)


def accepted_or_tpusim_error(parse, *args):
    """``parse(*args)``, or None when it raised TpusimError (any other exception fails the test)."""
    try:
        return parse(*args)
    except TpusimError as error:
        assert "\n" not in str(error) and "\t" not in str(error)     # one line, input never echoed raw
        return None


# ---- topology -----------------------------------------------------------------------------------------

@FAST
@given(ANY_TEXT)
def test_topology_parser_accepts_only_its_grammar(text):
    dims = accepted_or_tpusim_error(parse_topology, text)
    grammar = re.fullmatch(r" *([123])[dD]:([0-9]+(?:[xX][0-9]+)*) *", text, re.ASCII)
    if dims is not None:
        assert grammar and len(dims) == int(grammar.group(1)) and min(dims) >= 1


@FAST
@given(st.lists(st.integers(1, 10**6 - 1), min_size=1, max_size=3))
def test_topology_round_trips(dims):
    text = f"{len(dims)}d:" + "x".join(map(str, dims))
    assert parse_topology(text) == tuple(dims)


@FAST
@given(st.integers(1, 3), st.integers(7, 5000))
def test_axis_lengths_of_any_number_of_digits_are_refused_cleanly(ndims, digits):
    with pytest.raises(TpusimError):
        parse_topology(f"{ndims}d:" + "x".join(["9" * digits] * ndims))


@FAST
@given(ANY_TEXT, st.sampled_from([None, "v5p", "v6e", "v4"]))
def test_build_slice_never_leaks_another_exception(text, chip):
    accepted_or_tpusim_error(build_slice, text, chip)


# ---- chip names, slices -------------------------------------------------------------------------------

@FAST
@given(st.text(max_size=300))
def test_chip_names_are_checked_before_any_file(text):
    name = accepted_or_tpusim_error(parse_chip_name, text)
    if name is not None:
        assert name.isprintable() and name == text.strip(" ")
    accepted_or_tpusim_error(build_slice, "2d:2x2", text)


@FAST
@given(ANY_TEXT | st.integers(-10**12, 10**12).map(str))
def test_slices_is_a_whole_number_in_range(text):
    value = accepted_or_tpusim_error(parse_slices, text)
    if value is not None:
        assert 1 <= value <= MAX_SLICES and value == int(text)


# ---- byte sizes -----------------------------------------------------------------------------------------

@FAST
@given(ANY_TEXT)
def test_bytes_parser_returns_a_positive_int_or_a_tpusim_error(text):
    value = accepted_or_tpusim_error(parse_bytes, text)
    if value is not None:
        assert isinstance(value, int) and 0 < value <= MAX_BYTES


@FAST
@given(st.integers(1, MAX_BYTES))
def test_every_byte_count_is_read_exactly(n):
    assert parse_bytes(str(n)) == n


@FAST
@given(st.integers(1, 2**40), st.sampled_from([("KiB", 2**10), ("MiB", 2**20), ("kB", 10**3), ("GB", 10**9)]))
def test_units_multiply_exactly(n, unit):
    name, scale = unit
    expected = n * scale
    if expected <= MAX_BYTES:
        assert parse_bytes(f"{n}{name}") == expected
    else:
        with pytest.raises(TpusimError, match="out of range"):
            parse_bytes(f"{n}{name}")


@FAST
@given(st.integers(-400, 400))
def test_exponents_never_overflow(exponent):
    accepted_or_tpusim_error(parse_bytes, f"1e{exponent}")


# ---- placement ----------------------------------------------------------------------------------------

SLICE = build_slice("3d:4x4x4")


@FAST
@given(ANY_TEXT | st.text(alphabet="tpfsd=xyz0123456789,. \t", max_size=30))
def test_placement_text_returns_segments_on_the_slice(text):
    wanted = accepted_or_tpusim_error(parse_placement_text, text, SLICE)
    if wanted is not None:
        for segments in wanted.values():
            for axis, count in segments:
                assert 0 <= axis < SLICE.ndims and (count is None or 1 <= count <= SLICE.dims[axis])


# ---- plain text ----------------------------------------------------------------------------------------

@FAST
@given(st.text(max_size=50))
def test_plain_text_keeps_printable_ascii_only(text):
    kept = accepted_or_tpusim_error(plain_text, text, "flag", "accepted: words")
    assert (kept is not None) == all(" " <= ch <= "~" for ch in text)


# ---- the trace reader ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trace_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "program.jsonl"
    write_trace(training_trace(steps=2), path)
    return path.read_bytes()


def read_bytes_as_trace(tmp_path, data: bytes):
    path = tmp_path / "program.jsonl"
    path.write_bytes(data)
    return accepted_or_tpusim_error(read_trace, path)


@FAST
@given(data=st.binary(max_size=200))
def test_random_bytes_are_a_tpusim_error(tmp_path, data):
    assert read_bytes_as_trace(tmp_path, data) is None


@FAST
@given(cut=st.integers(0, 10**6))
def test_a_trace_cut_anywhere_is_refused(tmp_path, trace_bytes, cut):
    cut %= len(trace_bytes)             # every proper prefix, including cuts at line ends
    if trace_bytes[:cut] == trace_bytes.rstrip(b"\n"):
        return                          # only the last newline cut: every record is whole (found by hypothesis)
    assert read_bytes_as_trace(tmp_path, trace_bytes[:cut]) is None


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                  max_size=3), max_leaves=6)


@FAST
@given(line=st.integers(0, 30), data=st.data(),
       value=JSON | st.integers(-3, 10**6) | st.lists(st.integers(-1, 64), max_size=4) | st.floats(-1, 1e6))
def test_a_field_of_any_wrong_value_is_a_tpusim_error_or_a_valid_trace(tmp_path, trace_bytes, line, data, value):
    lines = trace_bytes.decode().splitlines()
    row = json.loads(lines[line % len(lines)])
    key = data.draw(st.sampled_from(sorted(row)))
    if key in ("inputs", "outputs") and row[key] and data.draw(st.booleans()):
        row[key][0][data.draw(st.sampled_from(sorted(row[key][0])))] = value   # a field of a tensor
    else:
        row[key] = value
    lines[line % len(lines)] = json.dumps(row)
    trace = read_bytes_as_trace(tmp_path, ("\n".join(lines) + "\n").encode())
    if trace is not None:                # what the reader accepts, the simulator can price
        accepted_or_tpusim_error(lambda: price(trace, topology=build_slice("3d:1x1x1"), mode=get_mode("strict")))


@FAST
@given(line=st.integers(1, 30), data=st.data(), value=st.integers(-10**6, 10**12) | st.floats(-1e12, 1e12))
def test_any_number_in_a_record_is_refused_or_priced(tmp_path, trace_bytes, line, data, value):
    lines = trace_bytes.decode().splitlines()
    row = json.loads(lines[line % (len(lines) - 1) + 1])
    numeric = sorted(k for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool))
    row[data.draw(st.sampled_from(numeric))] = value
    lines[line % (len(lines) - 1) + 1] = json.dumps(row)
    trace = read_bytes_as_trace(tmp_path, ("\n".join(lines) + "\n").encode())
    if trace is not None:
        accepted_or_tpusim_error(lambda: price(trace, topology=build_slice("3d:1x1x1"), mode=get_mode("strict")))


@FAST
@given(st.binary(min_size=1, max_size=8), st.integers(0, 10**6))
def test_a_trace_with_bytes_overwritten_never_leaks_another_exception(tmp_path, trace_bytes, junk, at):
    at %= len(trace_bytes)
    read_bytes_as_trace(tmp_path, trace_bytes[:at] + junk + trace_bytes[at + len(junk):])


# ---- report.json ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report():
    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    return json.loads(report_json(build_report(RunInfo("model.py"), trace, slice_, timelines)))


@FAST
@given(path=st.lists(st.sampled_from(["run", "chip", "slice", "modes", "strict", "host_s", "stall", "script",
                                      "version", "schema", "complete", "total_s", "kernels"]), min_size=1,
                     max_size=3),
       value=JSON)
def test_a_report_with_any_field_replaced_is_checked_or_refused(tmp_path, report, path, value):
    changed = json.loads(json.dumps(report))
    node = changed
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node[path[-1]] = value
    checked = accepted_or_tpusim_error(check_report, changed, tmp_path / "report.json")
    if checked is not None:
        original = check_report(report, tmp_path / "report.json")
        compare.notes(checked, original)   # what the loader accepts, compare can read
        compare.comparison(checked, original)


# ---- environment variables and chip files (issue 32: one strict parser each) -----------------------------

@FAST
@given(name=st.sampled_from(sorted(envvars.BY_NAME)), text=ANY_TEXT | st.text(min_size=1, max_size=12))
def test_every_environment_variable_is_read_or_refused_in_one_line(name, text):
    accepted_or_tpusim_error(envvars.read, name, {name: text})


CHIP_KEYS = sorted(re.findall(r"^\[([a-z0-9_]+)\]", (chips_dir() / "v5p.toml").read_text(), re.MULTILINE))
TOML_VALUES = (st.floats(allow_nan=True, allow_infinity=True).map(repr)      # inf, nan, 5e-324: all TOML
               | st.integers(-(2**63), 2**63 - 1).map(str) | st.text(max_size=8).map(json.dumps)
               | st.booleans().map(lambda b: "true" if b else "false") | st.just("[1, 2]"))


@FAST
@given(key=st.sampled_from(CHIP_KEYS), value=TOML_VALUES)
def test_a_chip_file_with_any_value_is_loaded_with_finite_numbers_or_refused(tmp_path_factory, key, value):
    text = (chips_dir() / "v5p.toml").read_text()
    text = re.sub(rf"(\[{key}\]\nvalue = )[^\n]*", lambda m: m.group(1) + value.replace("\\", "\\\\"), text)
    path = tmp_path_factory.mktemp("chip") / "v5p.toml"
    path.write_text(text)
    chip = accepted_or_tpusim_error(load_chip, str(path))
    if chip is not None:
        numbers = [v for v in dataclasses.asdict(chip).values() if isinstance(v, float)]
        assert all(math.isfinite(v) and (v == 0 or 1e-15 <= abs(v) <= 1e24) for v in numbers)
