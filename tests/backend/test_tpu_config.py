"""The device's settings as one typed DeviceConfig: built by a caller (``tpusim.backend.configure``),
read from TPUSIM_* variables, or handed to worker processes in one variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tpusim.backend as tb
from tpusim import envvars
from tpusim.backend.plumbing.config import CONFIG_ENV, DeviceConfig
from tpusim.errors import TpusimError
from tpusim.hardware.spec import chips_dir, load_chip


@pytest.fixture
def chip_file(tmp_path: Path) -> Path:
    """A chip of the user's own: v5e's numbers under another name, outside topologies/chips/."""
    text = (chips_dir() / "v5e.toml").read_text()
    text = text.replace('name = "v5e"', 'name = "my_chip"').replace('display_name = "TPU v5e"',
                                                                   'display_name = "TPU mine"')
    path = tmp_path / "my_chip.toml"
    path.write_text(text)
    return path


def test_defaults_come_from_the_chip() -> None:
    chip = load_chip("v5e")
    cfg = DeviceConfig(chip=chip)
    assert (cfg.device_count, cfg.hbm_bytes, cfg.numerics, cfg.f64, cfg.target) == \
        (chip.chips_per_host, chip.hbm_bytes, True, "warn", "sim")



@pytest.mark.parametrize(("chip", "topology", "devices"), [
    ("v5p", (1, 1, 1), 1),          # one chip of one device: torch.tpu.device_count() was 4, a host's
    ("v5e", (2, 2), 4),             # four chips, all on one host (a v5e host holds 8)
    ("v5p", (4, 4, 4), 4),          # 64 chips over 16 hosts: a process sees its host's 4
    ("v7", (1, 1, 1), 2),           # Ironwood: two devices per chip
    ("v7", (2, 2, 2), 8),           # a host of 4 chips, 2 devices each
])
def test_a_process_sees_the_slices_devices_on_its_host(chip: str, topology: tuple[int, ...], devices: int) -> None:
    """Issue 45: the device count is the slice's as a process sees it (JAX's local devices), not a whole host's."""
    assert DeviceConfig(chip=load_chip(chip), topology=topology).device_count == devices


def test_a_tpusim_run_on_one_chip_sees_one_device_and_tpu_1_is_invalid(tmp_path: Path) -> None:
    """Issue 45: a script that sizes its work by device_count() gets the simulated slice's devices; tpu:N past
    them raises as on CUDA."""
    import subprocess
    import sys

    (tmp_path / "count.py").write_text(
        "import torch\nprint('count', torch.tpu.device_count())\ntry:\n    torch.ones(1, device='tpu:1')\n"
        "except RuntimeError as err:\n    print('raised', err)\n")
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", "count.py", "--topology", "3d:1x1x1", "--mode",
                           "strict", "--compiler", "model", "--quiet", "--out", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "count 1" in done.stdout
    assert "raised tpusim: invalid device tpu:1 (invalid device ordinal): this process sees 1" in done.stdout

@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("device_count", 0, "1..64"), ("hbm_bytes", -5, "bytes >= 0"), ("f64", "bogus", "warn, error, allow"),
    ("target", "tpu", "sim, pjrt"), ("numerics", "off", "True or False")])
def test_bad_fields_are_named(field: str, value: object, accepted: str) -> None:
    with pytest.raises(TpusimError, match=f"DeviceConfig.{field}={value!r}; accepted: {accepted}"):
        DeviceConfig(chip=load_chip("v5e"), **{field: value})
    with pytest.raises(TpusimError, match="DeviceConfig.chip='v5e'; accepted: a tpusim.hardware.spec.ChipSpec"):
        DeviceConfig(chip="v5e")


def test_a_config_travels_in_one_variable(chip_file: Path) -> None:
    cfg = DeviceConfig(chip=load_chip(chip_file), numerics=False, f64="error", device_count=3, target="pjrt",
                       eager_mode="fused")
    assert DeviceConfig.from_json(cfg.to_json()) == cfg
    assert list(cfg.env()) == [CONFIG_ENV] and json.loads(cfg.env()[CONFIG_ENV])["chip"]["name"] == "my_chip"


def test_given_fields_are_not_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSIM_CHIP", "no-such-chip")
    monkeypatch.setenv("TPUSIM_F64", "error")
    cfg = tb.load_config(chip=load_chip("v5e"), numerics=False)
    assert (cfg.chip.name, cfg.numerics, cfg.f64) == ("v5e", False, "error")


BOOLEANS = ("TPUSIM_DEBUG_CHECK", "TPUSIM_DEBUG_LOG", "TPUSIM_XLA_OPS")   # TPUSIM_NUMERICS: these spellings + "tpu"
SPELLINGS = [(spelling, word in envvars.ON) for word in envvars.ON + envvars.OFF
             for spelling in (word, word.upper(), word.capitalize(), f" {word} ")]


def test_every_boolean_variable_is_listed_here() -> None:
    assert tuple(v.name for v in envvars.VARIABLES if v.parse is envvars.yes_no) == BOOLEANS


@pytest.mark.parametrize(("spelling", "value"), SPELLINGS)
def test_every_yes_no_spelling_the_check_accepts_loads_to_the_same_value(
        monkeypatch: pytest.MonkeyPatch, spelling: str, value: bool) -> None:
    for name in BOOLEANS:
        envvars.check({name: spelling})
        assert envvars.read(name, {name: spelling}) is value
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv("TPUSIM_NUMERICS", spelling)
    assert tb.load_config(chip=load_chip("v5e")).numerics is value


def test_the_debug_flags_load_every_yes_no_spelling(python: object) -> None:
    proc = python(f"""
        import importlib, os
        from tpusim.backend.dispatch import debug_mode
        for spelling, value in {SPELLINGS!r}:
            os.environ.update(TPUSIM_DEBUG_CHECK=spelling, TPUSIM_DEBUG_LOG=spelling)
            importlib.reload(debug_mode)          # the flags are read at import
            assert debug_mode.CHECK is value and debug_mode.LOG is value, (spelling, debug_mode.CHECK, debug_mode.LOG)
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_configure_takes_a_chip_from_any_file_before_the_first_tensor(python: object, chip_file: Path) -> None:
    proc = python(f"""
        import torch, tpusim.backend as tb
        from tpusim.hardware.spec import load_chip
        chip = load_chip({str(chip_file)!r})
        tb.configure(tb.load_config(chip=chip, device_count=2))
        print(torch.tpu.device_count(), torch.tpu.get_device_name(), torch.tpu.mem_get_info()[1] == chip.hbm_bytes)
        x = torch.ones(2, device="tpu:1")
        with tb.recording() as rec:
            (x + 1).sum()
        print(rec.trace.meta.chip, rec.trace.meta.devices)
        tb.configure(tb.load_config(chip=chip, device_count=2))      # the same config again: nothing to change
        try:
            tb.configure(tb.DeviceConfig(chip=load_chip("v5e")))
        except Exception as err:
            print(type(err).__name__, "while no tensor lives" in str(err))
        del x                                                        # nothing lives: another chip may take over
        v5e = tb.load_config(chip=load_chip("v5e"), numerics=False)
        tb.configure(v5e)
        y = torch.ones(3, device="tpu") * 2
        print(torch.tpu.get_device_name(), torch.tpu.device_count() == v5e.device_count,
              torch.tpu.mem_get_info()[1], y.device)
    """)
    assert proc.returncode == 0, proc.stderr
    v5e = load_chip("v5e")
    assert proc.stdout.splitlines() == ["2 TPU mine True", "my_chip 2", "TpusimError True",
                                        f"{v5e.display_name} True {v5e.hbm_bytes} tpu:0"]


def test_a_worker_reads_its_config_from_one_variable(python: object, chip_file: Path) -> None:
    cfg = DeviceConfig(chip=load_chip(chip_file), device_count=3, eager_mode="debug")
    proc = python("import torch, tpusim; print(torch.tpu.get_device_name(), torch.tpu.device_count(), "
                  "tpusim.get_eager_mode())", env={**cfg.env(), "TPUSIM_CHIP": "ignored-when-the-config-is-set"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "TPU mine 3 debug"
    proc = python("import tpusim.backend", env={CONFIG_ENV: "{not json"})
    assert proc.returncode != 0 and f"{CONFIG_ENV}=" in proc.stderr and "not a DeviceConfig" in proc.stderr


@pytest.mark.parametrize(("name", "value"), [
    ("TPU_VISIBLE_DEVICES", "²"),                   # str.isdigit() takes superscripts; int() then fails
    ("TPU_VISIBLE_DEVICES", "0,١"),                  # an Arabic-Indic one
    ("TPU_VISIBLE_CHIPS", "²"),
    ("TORCH_TPU_TOPOLOGY", "2,²,1"),
    ("TPUSIM_HBM_BYTES", "9" * 29),                 # past int64: the shim would overflow
])
def test_non_ascii_digits_and_overflowing_counts_are_one_line_errors(monkeypatch, name, value) -> None:
    """Issue 32, row 9: these were raw ValueError tracebacks (or a crash in the shim), now one TpusimError."""
    monkeypatch.setenv(name, value)
    with pytest.raises(TpusimError, match=name):
        tb.load_config(chip=load_chip("v5p"))
