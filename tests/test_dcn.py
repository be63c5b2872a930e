"""DCN for multislice (tpusim/network/collectives/dcn.py) against closed forms worked by hand.

Numbers: v5e hosts have 2 x 100 Gbps NICs (12.5e9 B/s each) for 8 chips in a 4x2 block
(topologies/dcn.toml), PCIe 1.6e10 B/s per chip, DCN latency 10 us per crossing (chip file).
The start-up overhead is set to 0 so the formulas below are the whole time.
"""

import dataclasses
import math
import tomllib

import pytest

from tpusim.errors import TpusimError
from tpusim.hardware.spec import available_chips, load_chip
from tpusim.network.collectives import closed_form_time, simulate_collective
from tpusim.network.collectives.dcn import _table, chip_dcn_rate, dcn_table_path, host_nics
from tpusim.slice.topology import build_slice

LAT = 10e-6
NIC = 100e9 / 8          # one v5e NIC, bytes/s


def v5e(**kw):
    return dataclasses.replace(load_chip("v5e"), collective_overhead_ns=0.0, **kw)


def _rows() -> dict:
    with open(dcn_table_path(), "rb") as f:
        return tomllib.load(f)


# ---- data ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", available_chips())
def test_every_chip_has_host_nics_consistent_with_its_per_chip_dcn_figure(name):
    """The chip file's per-chip DCN figure is the host's NIC total shared by all its chips, and the
    host block holds chips_per_host chips: two sources that must agree."""
    row, chip = _rows()[name], load_chip(name)
    assert row["nics_per_host"] * row["nic_gbps"] * 1e9 / 8 / chip.chips_per_host == pytest.approx(
        chip.dcn_bytes_per_s, rel=1e-12)
    assert math.prod(row["host_shape"]) == chip.chips_per_host
    assert len(row["host_shape"]) == chip.torus_dims
    assert ("source" in row) != ("estimate" in row)


def test_a_chip_without_a_row_keeps_its_per_chip_figure():
    chip = dataclasses.replace(load_chip("v5e"), name="custom")
    assert host_nics(chip).host_shape == ()
    assert chip_dcn_rate(chip, chip.chips_per_host) == chip.dcn_bytes_per_s


@pytest.mark.parametrize(("body", "message"), [
    ("[v5e]\nnics_per_host = 2\nnic_gbps = 100\n", "needs nics_per_host, host_shape"),
    ("[v5e]\nnics_per_host = 0\nnic_gbps = 100\nhost_shape = [4, 2]\nsource = 'x'\n", "nics_per_host must be >= 1"),
    ("[v5e\n", "not valid TOML"),
])
def test_a_bad_dcn_table_is_refused_with_one_clear_line(tmp_path, body, message):
    path = tmp_path / "dcn.toml"
    path.write_text(body)
    with pytest.raises(TpusimError, match=message):
        _table(str(path))


# ---- host NIC contention --------------------------------------------------------------------------

@pytest.mark.parametrize(("senders", "rate"), [
    (1, NIC),                 # one chip: a whole NIC (below its 1.6e10 PCIe link)
    (2, NIC),                 # two chips, two NICs: one each
    (4, 2 * NIC / 4),         # more chips than NICs: they share
    (8, 2 * NIC / 8),         # the whole host: the chip file's 3.125e9
])
def test_chips_of_a_host_share_its_nics(senders, rate):
    assert chip_dcn_rate(v5e(), senders) == pytest.approx(rate)


def test_a_lone_sender_is_capped_by_its_pcie_link():
    chip = v5e(pcie_bytes_per_s=5e9)
    assert chip_dcn_rate(chip, 1) == pytest.approx(5e9)


def test_calibrated_dcn_share_carries_over_to_the_nics():
    assert chip_dcn_rate(v5e(dcn_bytes_per_s=0.5 * 3.125e9), 8) == pytest.approx(0.5 * 3.125e9)


def test_a_slice_smaller_than_a_host_shares_fewer_chips_per_nic():
    """A 2x2 slice fills half a 4x2 host block: 4 senders on 2 NICs get 6.25e9 each, twice the
    full host's 3.125e9, so the DCN all-reduce's bandwidth term halves."""
    v = 64e6
    for dims, rate in (("2d:16x16", 2 * NIC / 8), ("2d:2x2", 2 * NIC / 4)):
        s = build_slice(dims, chip=v5e(), slices=4)
        r = simulate_collective(s, "all_reduce", v, axes="dcn")
        assert r.closed_form_s == pytest.approx(6 * (LAT + v / 4 / rate), rel=1e-9)
        assert r.time_s == pytest.approx(r.closed_form_s, rel=1e-3)


# ---- ring and tree over the slices -----------------------------------------------------------------

def test_large_shards_take_the_ring():
    """Ring all-reduce over S = 4 slices: 2(S-1) steps of (latency + V / (S x rate))."""
    v = 64e6
    s = build_slice("2d:16x16", chip=v5e(), slices=4)
    r = simulate_collective(s, "all_reduce", v, axes="dcn")
    assert r.algorithm == "dcn" and "by ring" in r.simulated
    assert r.closed_form_s == pytest.approx(6 * (LAT + v / 4 / (NIC / 4)), rel=1e-9)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=1e-3)


def test_small_shards_over_many_slices_take_the_tree():
    """1 kB over 32 slices: the ring's 62 latency steps (~620 us) lose to a binary tree's
    2 log2(32) = 10 steps of (latency + V / rate) (~103 us)."""
    v = 1e3
    s = build_slice("2d:16x16", chip=v5e(), slices=32)
    r = simulate_collective(s, "all_reduce", v, axes="dcn")
    assert "by tree" in r.simulated
    assert r.closed_form_s == pytest.approx(10 * (LAT + v / (NIC / 4)), rel=1e-9)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=1e-3)
    ring = 62 * (LAT + v / 32 / (NIC / 4))
    assert r.closed_form_s < ring


def test_tree_with_slices_not_a_power_of_two():
    v = 1e3
    s = build_slice("2d:16x16", chip=v5e(), slices=5)          # ceil(log2 5) = 3 levels each way
    r = simulate_collective(s, "all_reduce", v, axes="dcn")
    assert "by tree" in r.simulated
    assert r.closed_form_s == pytest.approx(6 * (LAT + v / (NIC / 4)), rel=1e-9)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=1e-3)


# ---- hierarchical data parallelism ----------------------------------------------------------------

def test_whole_world_all_reduce_is_ici_reduce_scatter_dcn_shard_all_reduce_ici_all_gather():
    """All-reduce over 2 slices of 16x16: the ICI reduce-scatter and all-gather of one slice, plus a
    DCN ring all-reduce of the V/256 shard at the shared rate: 2 x (latency + V/256/2/3.125e9)."""
    v = 256e6
    two = build_slice("2d:16x16", chip=v5e(), slices=2)
    one = build_slice("2d:16x16", chip=v5e())
    ici = closed_form_time(one, "reduce_scatter", v) + closed_form_time(one, "all_gather", v)
    dcn = 2 * (LAT + v / 256 / 2 / (NIC / 4))
    r = simulate_collective(two, "all_reduce", v)
    assert r.algorithm == "dcn"
    assert r.closed_form_s == pytest.approx(ici + dcn, rel=1e-9)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=0.01)


def test_110592_chips_price_the_dcn_stage_per_host_block():
    """v7 3d:16x24x24 x 12 slices: a 2x2x1 host block of 4 chips on 2 x 200 Gbps NICs gives each
    chip 12.5e9 B/s; a 1 GB all-reduce over the slices is a ring, 22 x (10 us + 1e9 / 12 / 12.5e9).
    (How long pricing takes is measured by benchmarks/bench_dcn.py, not here.)"""
    s = build_slice("3d:16x24x24", chip=dataclasses.replace(load_chip("v7"), collective_overhead_ns=0.0), slices=12)
    assert s.num_chips * s.num_slices == 110_592
    r = simulate_collective(s, "all_reduce", 1e9, axes="dcn")
    assert "by ring" in r.simulated and "4 sender(s) per host" in r.simulated
    assert r.closed_form_s == pytest.approx(22 * (LAT + 1e9 / 12 / 12.5e9), rel=1e-9)
    assert r.time_s == pytest.approx(r.closed_form_s, rel=1e-3)
