"""Every environment variable tpusim reads is checked up front with one clear error (issue 17): the table in
tpusim/envvars.py, property-tested; `tpusim run` refuses a bad value before the device loads; the chip
lookup never leaks the file system's own errors. Torch-free."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpusim import envvars
from tpusim.cli.main import main
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = [v.name for v in envvars.VARIABLES]


@FAST
@given(name=st.sampled_from(NAMES), raw=st.text(max_size=30) | st.text(alphabet="0123456789.e+-x onfa\t\n",
                                                                       max_size=12))
def test_any_value_is_read_or_refused_naming_the_variable(name, raw):
    try:
        envvars.read(name, {name: raw})
    except TpusimError as error:
        text = str(error)
        assert text.startswith(f"{name}=") and "\t" not in text and "\n" not in text   # value shown quoted
        assert "accepted" in text or "chip" in text or "eager mode" in text


@FAST
@given(n=st.integers(min_value=0, max_value=10**30))
def test_whole_numbers_are_read_exactly_and_checked_against_their_range(n):
    try:
        assert envvars.read("TPUSIM_HBM_BYTES", {"TPUSIM_HBM_BYTES": str(n)}) == n and n <= 2**62
    except TpusimError:
        assert n > 2**62                      # the shim counts bytes in int64
    inside = 1 <= n <= 64
    try:
        assert envvars.read("TPUSIM_DEVICES", {"TPUSIM_DEVICES": str(n)}) == n and inside
    except TpusimError:
        assert not inside


@FAST
@given(x=st.floats(allow_nan=True, allow_infinity=True))
def test_seconds_must_be_finite_and_positive(x):
    try:
        assert envvars.read("TPUSIM_HANG_TIMEOUT_S", {"TPUSIM_HANG_TIMEOUT_S": repr(x)}) == x and 0 < x < float("inf")
    except TpusimError:
        assert not (0 < x < float("inf"))


@pytest.mark.parametrize("environ, expected", [
    ({"TPUSIM_DEBUG_CHECK": "maybe"}, "TPUSIM_DEBUG_CHECK='maybe'; accepted: on, off"),
    ({"TPUSIM_HBM_BYTES": "-5"}, "TPUSIM_HBM_BYTES='-5'; accepted: a whole number of bytes 0..2**62"),
    ({"TPUSIM_HANG_TIMEOUT_S": "soon"}, "TPUSIM_HANG_TIMEOUT_S='soon'; accepted: seconds > 0"),
    ({"TPUSIM_RANKS": "some"}, "TPUSIM_RANKS='some'; accepted: one, all"),
    ({"TPUSIM_EAGER_MODE": "lazy"}, "TPUSIM_EAGER_MODE='lazy': unknown eager mode 'lazy'; accepted: debug, strict"),
    ({"TPUSIM_TOPOLOGIES": "/no/such/folder"}, "TPUSIM_TOPOLOGIES='/no/such/folder'; accepted: an existing folder"),
    ({"TPUSIM_CHIP": "nosuch"}, "TPUSIM_CHIP='nosuch': unknown chip 'nosuch'"),       # issue 32, row 10: ignored
    ({"TPUSIM_NUMERICS": "maybe"}, "TPUSIM_NUMERICS='maybe'; accepted: on, off"),
])
def test_tpusim_run_refuses_a_bad_variable_before_the_device_loads(capsys, monkeypatch, environ, expected):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("tpusim.backend"):
            raise AssertionError("the device was loaded before the environment was checked")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    code = main(["run", str(ROOT / "examples" / "mlp.py"), "--out", "/tmp/never-written-by-this-test"])
    out, err = capsys.readouterr()
    assert code == 2 and expected in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_every_bad_variable_is_listed_in_one_error():
    with pytest.raises(TpusimError) as caught:
        envvars.check({"TPUSIM_F64": "bogus", "TPUSIM_DEVICES": "0", "TPUSIM_NUMERICS": "on"})
    assert str(caught.value).splitlines() == ["TPUSIM_DEVICES='0'; accepted: a whole number 1..64",
                                              "TPUSIM_F64='bogus'; accepted: warn, error, allow"]


@pytest.mark.parametrize("name", ["a" * 5000, "/tmp/" + "b" * 300 + ".toml", "v5p\x00"])
def test_a_chip_name_the_file_system_refuses_is_a_tpusim_error(name):
    with pytest.raises(TpusimError, match="chip"):
        load_chip(name)


def test_the_device_failing_to_load_is_one_clear_error(monkeypatch):
    from tpusim.run import pipeline as run

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):   # as `import torch` fails when its autoload of the device fails
        if name == "torch":
            raise RuntimeError("Failed to load the backend extension") from OSError("the shim did not compile")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(TpusimError, match="the tpu device could not be loaded: OSError: the shim did not compile"):
        run._import_backend()
