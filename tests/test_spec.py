"""Chip files: every TOML under topologies/chips loads, agrees with itself and with the published figures;
a broken file is refused with one line that names the file, the key and what is accepted."""

import dataclasses
import re
from pathlib import Path

import pytest

from tpusim.cli.chips_table import format_chips_table, source_document
from tpusim.errors import TpusimError
from tpusim.hardware.spec import (
    PLAIN_KEYS,
    TOPOLOGY_DIMS,
    ChipSpec,
    available_chips,
    chip_for_device_kind,
    chip_sources,
    chips_dir,
    default_chip,
    default_chip_for_dims,
    is_estimate,
    load_chip,
)

CHIPS = available_chips()
FIELDS = [field.name for field in dataclasses.fields(ChipSpec)]
GiB = 2**30


def test_the_five_generations_are_there():
    assert {"v4", "v5e", "v5p", "v6e", "v7"} <= set(CHIPS)
    assert CHIPS == sorted(CHIPS)


@pytest.mark.parametrize("name", CHIPS)
def test_every_chip_file_loads_with_a_source_for_every_value(name):
    chip = load_chip(name)
    sources = chip_sources(name)
    assert chip.name == name
    assert set(sources) == set(FIELDS) - set(PLAIN_KEYS)   # every chip file names its JAX device kinds too
    assert all(text.strip() for text in sources.values())
    assert load_chip(name.upper()) is chip  # case-insensitive, and cached


@pytest.mark.parametrize("name", CHIPS)
def test_peak_bf16_is_cores_x_mxus_x_array_x_clock_where_the_clock_is_published(name):
    chip = load_chip(name)
    if is_estimate(chip_sources(name)["clock_hz"]):
        pytest.skip("clock is derived from the peak, so the check would be circular")
    macs_per_cycle = chip.tensorcores_per_chip * chip.mxus_per_tensorcore * chip.mxu_size**2
    assert macs_per_cycle * 2 * chip.clock_hz == pytest.approx(chip.peak_bf16_flops_per_s, rel=0.01)


@pytest.mark.parametrize("name", CHIPS)
def test_numbers_are_ordered_as_hardware_requires(name):
    chip = load_chip(name)
    assert chip.peak_int8_flops_per_s >= chip.peak_bf16_flops_per_s
    assert chip.peak_fp8_flops_per_s >= chip.peak_bf16_flops_per_s
    assert chip.peak_f32_flops_per_s < chip.peak_bf16_flops_per_s  # multi-pass on the bf16 MXU
    assert chip.vpu_flops_per_s < chip.peak_bf16_flops_per_s
    assert chip.ici_link_bytes_per_s < chip.hbm_bytes_per_s
    assert chip.dcn_bytes_per_s < chip.ici_link_bytes_per_s
    assert chip.vmem_bytes < chip.hbm_bytes
    assert len(chip.max_slice_shape) == chip.torus_dims
    assert chip.ici_ports_per_chip == 2 * chip.torus_dims
    assert chip.wrap_rule in ("cube", "full_axis")


def test_v5p_matches_the_cloud_tpu_v5p_doc():
    """docs.cloud.google.com/tpu/docs/v5p 'System architecture' table and configurations."""
    chip = load_chip("v5p")
    assert chip.peak_bf16_flops_per_s == 459e12
    assert chip.hbm_bytes == 95 * GiB
    assert chip.hbm_bytes_per_s == 2765e9
    assert (chip.tensorcores_per_chip, chip.sparsecores_per_chip) == (2, 4)
    # 1200 GB/s bidirectional per chip over 6 ports; the usable one-way figure is a little lower
    assert 6 * 2 * chip.ici_link_bytes_per_s == pytest.approx(1200e9, rel=0.15)
    assert chip.dcn_bytes_per_s == 50e9 / 8
    assert chip.max_slice_shape == (16, 16, 24)
    assert (chip.wrap_rule, chip.wrap_cube_size, chip.twisted_tori) == ("cube", 4, True)


def test_other_generations_match_their_cloud_docs():
    assert load_chip("v4").peak_bf16_flops_per_s == 275e12
    assert load_chip("v4").hbm_bytes == 32 * GiB
    assert load_chip("v5e").peak_bf16_flops_per_s == 197e12
    assert load_chip("v5e").sparsecores_per_chip == 0
    assert load_chip("v6e").peak_bf16_flops_per_s == 918e12
    assert load_chip("v6e").mxu_size == 256
    assert load_chip("v7").peak_bf16_flops_per_s == 2307e12
    assert load_chip("v7").hbm_bytes == 192 * GiB
    assert load_chip("v7").max_slice_shape == (16, 24, 24)  # 9216 chips per pod


def test_scaling_book_link_bandwidths():
    """One-way per link, 'How to Think About TPUs' interconnect table."""
    assert {name: load_chip(name).ici_link_bytes_per_s for name in ("v4", "v5e", "v5p", "v6e")} == {
        "v4": 4.5e10, "v5e": 4.5e10, "v5p": 9e10, "v6e": 9e10}


def test_the_defaults_come_from_the_chip_files():
    assert default_chip().name == "v5p"
    assert {dims: default_chip_for_dims(dims).name for dims in TOPOLOGY_DIMS} == {1: "v5e", 2: "v6e", 3: "v5p"}
    for dims in TOPOLOGY_DIMS:
        assert default_chip_for_dims(dims).torus_dims == max(dims, 2)   # a 1-D ring is a row of a 2-D torus


@pytest.mark.parametrize("name", CHIPS)
def test_every_chip_is_found_by_each_of_its_jax_device_kinds(name):
    chip = load_chip(name)
    assert chip.jax_device_kinds
    for kind in chip.jax_device_kinds:
        assert chip_for_device_kind(kind) is chip
        assert chip_for_device_kind(kind.upper().replace(" ", "  ")) is chip   # case and spacing ignored


def test_chips_table_has_a_row_per_chip_and_lists_sources():
    table = format_chips_table()
    for name in CHIPS:
        assert re.search(rf"^{name}\s", table, re.MULTILINE)
    assert "Sources:" in table and "Scaling book" in table
    assert "2307" in table and "16x16x24" in table


def test_source_document_is_the_text_before_the_first_comma_outside_parentheses():
    assert source_document("Doc (a.com/x, y), section: 1") == "Doc (a.com/x, y)"


# ---- broken files -------------------------------------------------------------------------------

def good_toml() -> str:
    return (chips_dir() / "v5p.toml").read_text()


def write(tmp_path: Path, text: str, name: str = "v5p") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(TpusimError) as info:
        load_chip(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_copied_file_loads_by_path(tmp_path):
    assert load_chip(write(tmp_path, good_toml())) == load_chip("v5p")


def test_missing_key_names_the_file_the_key_and_what_is_accepted(tmp_path):
    text = re.sub(r"\[vmem_bytes\]\nvalue = .*\nsource = .*\n", "", good_toml())
    message = load_error(path := write(tmp_path, text))
    assert str(path) in message and "missing key 'vmem_bytes'" in message and "hbm_bytes_per_s" in message


def test_unknown_key_is_named_with_the_accepted_keys(tmp_path):
    message = load_error(write(tmp_path, good_toml() + '\n[hbm_gigabytes]\nvalue = 95\nsource = "x"\n'))
    assert "unknown key 'hbm_gigabytes'" in message and "accepted keys:" in message and "hbm_bytes" in message


def test_negative_bandwidth_is_refused(tmp_path):
    link = "[ici_link_bytes_per_s]\nvalue = "
    text = good_toml().replace(link + "9e10", link + "-9e10")
    message = load_error(write(tmp_path, text))
    assert "ici_link_bytes_per_s" in message and "> 0" in message and "negative" in message


@pytest.mark.parametrize("value", ["5e-324", "1e-300", "1e300"])
def test_a_value_no_chip_has_is_refused(tmp_path, value):
    # Issue 32, row 10: a bandwidth of 5e-324 B/s passed "finite and > 0" and priced every op at nan ns (bare
    # NaN in report.json, a crash before report.html).
    link = "[ici_link_bytes_per_s]\nvalue = "
    message = load_error(write(tmp_path, good_toml().replace(link + "9e10", link + value)))
    assert "ici_link_bytes_per_s" in message and "outside 1e-15..1e+24" in message


def test_zero_is_refused_except_for_sparsecore_fields(tmp_path):
    text = good_toml().replace("[clock_hz]\nvalue = 1.75e9", "[clock_hz]\nvalue = 0")
    assert "clock_hz" in load_error(write(tmp_path, text))


def test_half_missing_sparsecores_are_refused(tmp_path):
    text = good_toml().replace("[sparsecore_tiles]\nvalue = 16", "[sparsecore_tiles]\nvalue = 0")
    assert "SparseCore" in load_error(write(tmp_path, text))


def test_bad_wrap_rule_lists_the_accepted_rules(tmp_path):
    text = good_toml().replace('value = "cube"', 'value = "torus"')
    message = load_error(write(tmp_path, text))
    assert "wrap_rule" in message and "'cube'" in message and "'full_axis'" in message


def test_value_without_source_or_estimate_is_refused(tmp_path):
    text = re.sub(r"(\[mxu_size\]\nvalue = 128\n)source = .*\n", r"\1", good_toml())
    message = load_error(write(tmp_path, text))
    assert "[mxu_size]" in message and "source" in message and "estimate" in message


def test_value_with_both_source_and_estimate_is_refused(tmp_path):
    text = good_toml().replace("[mxu_size]\nvalue = 128\n", '[mxu_size]\nvalue = 128\nestimate = "guess"\n')
    assert "both" in load_error(write(tmp_path, text))


def test_bare_value_without_a_table_is_refused(tmp_path):
    text = re.sub(r"\[mxu_size\]\nvalue = 128\nsource = .*\n", "", good_toml())
    text = text.replace('display_name = "TPU v5p"', 'display_name = "TPU v5p"\nmxu_size = 128')
    assert "must be a table" in load_error(write(tmp_path, text))


def test_count_must_be_whole(tmp_path):
    text = good_toml().replace("[ici_ports_per_chip]\nvalue = 6", "[ici_ports_per_chip]\nvalue = 5.5")
    assert "whole number" in load_error(write(tmp_path, text))


def test_name_must_match_the_file_name(tmp_path):
    assert "must match the file name" in load_error(write(tmp_path, good_toml(), name="mychip"))


def test_invalid_toml_names_the_file(tmp_path):
    message = load_error(path := write(tmp_path, "name = \n"))
    assert str(path) in message and "TOML" in message


def test_unknown_chip_lists_the_available_ones():
    with pytest.raises(TpusimError) as info:
        load_chip("v9")
    assert "unknown chip 'v9'" in str(info.value)
    assert all(name in str(info.value) for name in CHIPS)


def test_device_kinds_must_be_a_list_of_strings(tmp_path):
    text = good_toml().replace('value = ["TPU v5", "TPU v5p"]', 'value = "TPU v5"')
    assert "jax_device_kinds" in load_error(write(tmp_path, text))


def test_a_default_for_the_wrong_dimensionality_is_refused(tmp_path):
    text = good_toml().replace("default_for_dims = [3]", "default_for_dims = [2]")
    message = load_error(write(tmp_path, text))
    assert "default_for_dims lists 2" in message and "3-D torus" in message
    text = good_toml().replace("default_for_dims = [3]", "default_for_dims = [4]")
    assert "topology dimensionalities" in load_error(write(tmp_path, text))


def test_the_defaults_must_be_unique(tmp_path, monkeypatch):
    (tmp_path / "chips").mkdir()
    write(tmp_path / "chips", good_toml())
    write(tmp_path / "chips", good_toml().replace('name = "v5p"', 'name = "v5q"'), name="v5q")
    monkeypatch.setenv("TPUSIM_TOPOLOGIES", str(tmp_path))
    with pytest.raises(TpusimError, match="exactly one chip file .* default = true; found: v5p, v5q"):
        default_chip()
    with pytest.raises(TpusimError, match="must list 2 in default_for_dims; found: none"):
        default_chip_for_dims(2)


def test_optional_names_and_defaults_may_be_left_out(tmp_path):
    text = re.sub(r"\[jax_device_kinds\]\nvalue = .*\nsource = .*\n", "", good_toml())
    text = text.replace("default = true\n", "").replace("default_for_dims = [3]\n", "")
    chip = load_chip(write(tmp_path, text))
    assert (chip.jax_device_kinds, chip.default, chip.default_for_dims) == ((), False, ())


def test_topologies_folder_can_be_overridden(tmp_path, monkeypatch):
    (tmp_path / "chips").mkdir()
    write(tmp_path / "chips", good_toml())
    monkeypatch.setenv("TPUSIM_TOPOLOGIES", str(tmp_path))
    assert available_chips() == ["v5p"]
    assert chips_dir() == tmp_path / "chips"
    with pytest.raises(TpusimError, match="available chips: v5p"):
        load_chip("v4")


def test_a_chip_file_that_is_not_utf8_is_one_line_and_the_others_are_listed(tmp_path, monkeypatch):
    # Issue 32, row 9: a raw UnicodeDecodeError, and one such file in the chips folder broke `tpusim chips`.
    (tmp_path / "chips").mkdir()
    write(tmp_path / "chips", good_toml())
    (tmp_path / "chips" / "broken.toml").write_bytes(b'[name]\nvalue = "\xff\xfe"\n')
    monkeypatch.setenv("TPUSIM_TOPOLOGIES", str(tmp_path))
    with pytest.raises(TpusimError, match="broken.toml: not UTF-8 text"):
        load_chip(str(tmp_path / "chips" / "broken.toml"))
    table = format_chips_table()
    assert "v5p" in table and table.splitlines()[-1].startswith("skipped broken: ")
