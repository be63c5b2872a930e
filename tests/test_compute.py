"""Kernel costs against numbers derived by hand from the chip's rates (shown in comments)."""

import dataclasses

import pytest

from tpusim.errors import TpusimError
from tpusim.hardware.compute import kernel_cost, matmul_padding, mxu_peak_flops_per_s, transfer_seconds
from tpusim.hardware.spec import load_chip
from tpusim.trace.records import HostRecord, OpRecord

ITEM = {"bfloat16": 2, "float32": 4, "int8": 1, "float8_e4m3fn": 1}


def toy_chip(**overrides):
    """Round numbers so every expected time below is mental arithmetic."""
    base = dict(name="toy", tensorcores_per_chip=1, mxus_per_tensorcore=4, mxu_size=128,
                peak_bf16_flops_per_s=100e12, peak_int8_flops_per_s=200e12, peak_fp8_flops_per_s=200e12,
                peak_f32_flops_per_s=25e12, vpu_flops_per_s=10e12, transcendentals_per_s=1e12,
                hbm_bytes=16 * 10**9, hbm_bytes_per_s=1e12, sparsecores_per_chip=0,
                sparsecore_gather_bytes_per_s=0.5e12, pcie_bytes_per_s=10e9, kernel_launch_ns=1000.0)
    base.update(overrides)
    return dataclasses.replace(load_chip("v5p"), **base)


def mm(b, m, k, n, dtype="bfloat16"):
    s = ITEM[dtype]
    return OpRecord(seq=0, op="aten::bmm", unit="mxu", dtype=dtype, flops=2.0 * b * m * k * n,
                    bytes_read=s * (b * m * k + b * k * n), bytes_written=s * b * m * n, matmul=(b, m, k, n))


def test_mxu_padding_64_wide_costs_as_much_as_128_wide():
    chip = toy_chip()
    # k = 64 pads to one 128 tile: padded FLOPs = 2*8192*128*8192 = 1.718e10 -> 171.8 us at 100 TFLOP/s.
    # HBM: 2 B * (8192*64 + 64*8192 + 8192*8192) = 136 MB -> 136 us, so both are MXU-bound.
    half, full = kernel_cost(mm(1, 8192, 64, 8192), chip), kernel_cost(mm(1, 8192, 128, 8192), chip)
    assert half.bound == full.bound == "mxu"
    assert half.seconds == pytest.approx(full.seconds)
    assert half.seconds == pytest.approx(2 * 8192 * 128 * 8192 / 100e12 + 1e-6)
    assert half.padded_flops == full.padded_flops == 2 * 8192 * 128 * 8192
    assert half.tile_efficiency == 0.5 and full.tile_efficiency == 1.0
    # n = 64 (the PV matmul of attention with head dim 64) wastes the same half.
    assert kernel_cost(mm(1, 8192, 8192, 64), chip).tile_efficiency == 0.5


def test_padding_rules_m_rounds_to_sublanes_k_n_to_tiles():
    chip = toy_chip()
    assert matmul_padding((3, 5, 64, 130), chip) == (3, 8, 128, 256)
    assert matmul_padding((3, 5, 64, 130), toy_chip(mxu_size=256)) == (3, 8, 256, 256)


def test_v6e_256_tiles_waste_three_quarters_at_head_dim_64():
    chip = toy_chip(mxu_size=256)
    # On a 256x256 MXU, k = 64 and k = 128 both pad to 256: same time, 1/4 and 1/2 useful.
    c64, c128, c256 = (kernel_cost(mm(1, 8192, k, 8192), chip) for k in (64, 128, 256))
    assert c64.compute_s == pytest.approx(c128.compute_s) == pytest.approx(c256.compute_s)
    assert (c64.tile_efficiency, c128.tile_efficiency) == (0.25, 0.5)


def test_real_v6e_has_256_tiles_and_v5p_128():
    v6e, v5p = load_chip("v6e"), load_chip("v5p")
    assert (v6e.mxu_size, v5p.mxu_size) == (256, 128)
    # Attention with head dim 64: QK^T has k = 64, PV has n = 64.
    assert kernel_cost(mm(16, 2048, 64, 2048), v6e).tile_efficiency == 0.25
    assert kernel_cost(mm(16, 2048, 2048, 64), v5p).tile_efficiency == 0.5
    assert kernel_cost(mm(16, 2048, 128, 2048), v6e).compute_s == pytest.approx(
        kernel_cost(mm(16, 2048, 256, 2048), v6e).compute_s)


def test_fewer_weight_tiles_than_mxus_leave_mxus_idle():
    chip = toy_chip()  # 4 MXUs
    # One 128x128 weight tile runs on 1 of 4 MXUs: 2*1024*128*128 FLOPs at 25 TFLOP/s = 1.342 us,
    # 4x the 0.336 us the FLOP count alone would give at the chip's peak.
    cost = kernel_cost(mm(1, 1024, 128, 128), chip)
    assert cost.compute_s == pytest.approx(2 * 1024 * 128 * 128 / 25e12)


def test_compute_bound_matmul_hits_the_dtype_peak():
    chip = toy_chip()
    # 8192^3 bf16: 1.0995e12 FLOPs / 100e12 = 10.995 ms; HBM 3 * 8192^2 * 2 B = 403 MB -> 0.4 ms.
    cost = kernel_cost(mm(1, 8192, 8192, 8192), chip)
    assert cost.bound == "mxu"
    assert cost.seconds == pytest.approx(2 * 8192**3 / 100e12 + 1e-6)
    assert cost.mxu_utilisation == pytest.approx(1.0, rel=1e-3)


def test_f32_slower_and_int8_faster_by_the_chips_ratios():
    for chip in (toy_chip(), load_chip("v5p")):
        bf16 = kernel_cost(mm(1, 8192, 8192, 8192), chip).compute_s
        f32 = kernel_cost(mm(1, 8192, 8192, 8192, "float32"), chip).compute_s
        int8 = kernel_cost(mm(1, 8192, 8192, 8192, "int8"), chip).compute_s
        fp8 = kernel_cost(mm(1, 8192, 8192, 8192, "float8_e4m3fn"), chip).compute_s
        assert f32 / bf16 == pytest.approx(chip.peak_bf16_flops_per_s / chip.peak_f32_flops_per_s)
        assert bf16 / int8 == pytest.approx(chip.peak_int8_flops_per_s / chip.peak_bf16_flops_per_s)
        assert bf16 / fp8 == pytest.approx(chip.peak_fp8_flops_per_s / chip.peak_bf16_flops_per_s)
    chip = toy_chip()
    assert mxu_peak_flops_per_s(chip, "torch.float16") == mxu_peak_flops_per_s(chip, "bfloat16") == 100e12
    f32 = kernel_cost(mm(1, 8192, 8192, 8192, "float32"), chip)
    assert f32.compute_s == pytest.approx(2 * 8192**3 / 25e12)   # 43.98 ms: 4x the bf16 time


def test_memory_bound_elementwise_takes_bytes_over_hbm_bandwidth():
    chip = toy_chip()
    n = 2**24
    # add of two f32 vectors: read 2 * 64 MiB, write 64 MiB = 201,326,592 B -> 201.3 us at 1 TB/s,
    # VPU 16.8 MFLOP / 10 TFLOP/s = 1.7 us; plus 1 us launch.
    op = OpRecord(seq=0, op="aten::add", unit="vpu", dtype="float32", flops=n, bytes_read=8 * n,
                  bytes_written=4 * n)
    cost = kernel_cost(op, chip)
    assert cost.bound == "hbm"
    assert cost.seconds == pytest.approx(12 * n / 1e12 + 1e-6)
    assert cost.mxu_utilisation == 0.0


def test_transcendental_bound_and_launch_bound():
    chip = toy_chip()
    n = 2**24
    # exp over f32: 16.8 M transcendentals / 1e12 = 16.8 us, but HBM 8 B * n / 1 TB/s = 134 us wins.
    exp = OpRecord(seq=0, op="aten::exp", unit="vpu", dtype="float32", transcendentals=n,
                   bytes_read=4 * n, bytes_written=4 * n)
    assert kernel_cost(exp, chip).bound == "hbm"
    # The same exp with its data already on chip (no HBM bytes): 16.8 us of transcendental work.
    hot = dataclasses.replace(exp, bytes_read=0, bytes_written=0)
    assert kernel_cost(hot, chip).bound == "transcendental"
    assert kernel_cost(hot, chip).compute_s == pytest.approx(n / 1e12)
    # A 4-element add: 48 B -> 48 ps of HBM time; the 1 us launch dominates.
    tiny = OpRecord(seq=0, op="aten::add", unit="vpu", dtype="float32", flops=4, bytes_read=32,
                    bytes_written=16)
    cost = kernel_cost(tiny, chip)
    assert cost.bound == "launch" and cost.seconds == pytest.approx(1e-6 + 48 / 1e12)


def lookup(rows=4096, dim=1024):
    # embedding(indices[4096], table[V, 1024] f32): reads the 4096 rows (16 MiB) and the int32 indices
    # (16 KiB), writes 16 MiB.
    return OpRecord(seq=0, op="aten::embedding", unit="sparsecore", dtype="float32",
                    bytes_read=rows * dim * 4 + rows * 4, bytes_written=rows * dim * 4)


def test_embedding_lookup_on_sparsecores():
    chip = toy_chip(sparsecores_per_chip=4, hbm_bytes_per_s=2e12)
    op = lookup()
    nbytes = op.bytes_read + op.bytes_written          # 33,570,816 B
    cost = kernel_cost(op, chip)
    # 33.6 MB / 0.5 TB/s = 67.1 us on the SparseCores (HBM alone: 16.8 us).
    assert cost.bound == "sparsecore" and not cost.fallback
    assert cost.seconds == pytest.approx(nbytes / 0.5e12 + 1e-6)


def test_embedding_lookup_falls_back_to_tensorcore_without_sparsecores():
    v5e_like = toy_chip(sparsecores_per_chip=0)
    op = lookup()
    cost = kernel_cost(op, v5e_like)
    # TensorCore: 4 Mi elements through the VPU = 0.42 us; HBM 33.6 MB / 1 TB/s = 33.6 us.
    assert cost.fallback and cost.unit == "sparsecore"
    assert cost.bound == "hbm"
    assert cost.compute_s == pytest.approx(4096 * 1024 / 10e12)
    assert cost.seconds == pytest.approx((op.bytes_read + op.bytes_written) / 1e12 + 1e-6)
    # A VPU-starved chip shows the VPU term instead.
    slow = kernel_cost(op, toy_chip(vpu_flops_per_s=1e11))
    assert slow.bound == "vpu" and slow.seconds == pytest.approx(4096 * 1024 / 1e11 + 1e-6)


def test_real_chips_embedding_on_v5p_sparsecores_vs_v5e_tensorcore():
    op = lookup(rows=131072, dim=128)          # 64 MiB of rows gathered, 134.7 MB moved in all
    nbytes = op.bytes_read + op.bytes_written
    v5p, v5e = load_chip("v5p"), load_chip("v5e")
    on_sc = kernel_cost(op, v5p)
    assert v5p.sparsecores_per_chip > 0 and on_sc.bound == "sparsecore" and not on_sc.fallback
    assert on_sc.seconds == pytest.approx(nbytes / v5p.sparsecore_gather_bytes_per_s + v5p.kernel_launch_ns / 1e9)
    on_tc = kernel_cost(op, v5e)
    assert v5e.sparsecores_per_chip == 0 and on_tc.fallback
    assert on_tc.seconds == pytest.approx(max(nbytes / v5e.hbm_bytes_per_s, 131072 * 128 / v5e.vpu_flops_per_s)
                                          + v5e.kernel_launch_ns / 1e9)


def test_dma_copy_and_pcie_transfer():
    chip = toy_chip()
    copy = OpRecord(seq=0, op="aten::copy_", unit="dma", dtype="float32", bytes_read=1e9, bytes_written=1e9)
    assert kernel_cost(copy, chip).seconds == pytest.approx(2e9 / 1e12 + 1e-6)   # 2 ms + launch
    h2d = HostRecord(seq=0, event="h2d", bytes=10**9)
    assert transfer_seconds(h2d, chip) == pytest.approx(0.1)   # 1 GB / 10 GB/s
    assert transfer_seconds(HostRecord(seq=0, event="sync"), chip) == 0.0


def test_bad_input_names_the_op():
    chip = toy_chip()
    with pytest.raises(TpusimError, match="unit 'gpu'"):
        kernel_cost(OpRecord(seq=3, op="aten::mm", unit="gpu", dtype="float32"), chip)
    with pytest.raises(TpusimError, match="complex64"):
        kernel_cost(OpRecord(seq=0, op="aten::mm", unit="mxu", dtype="complex64", flops=1.0), chip)
    with pytest.raises(TpusimError, match="must be positive"):
        matmul_padding((1, 0, 8, 8), chip)


# ---- matmul shape terms (opt-in calibration terms: topologies/calibration/<chip>.toml) --------------

def shaped_chip(load_cycles=128.0, fill_cycles=256.0):
    """A 4-MXU chip at 1 GHz whose bf16 peak is one LHS row per MXU per cycle (4 x 2 x 128^2 x 1e9), int8 two."""
    from tpusim.hardware.calibration import CalibratedChip
    from tpusim.hardware.compute import CalibrationTerms

    base = toy_chip(clock_hz=1e9, peak_bf16_flops_per_s=4 * 2 * 128**2 * 1e9,
                    peak_int8_flops_per_s=2 * 4 * 2 * 128**2 * 1e9, hbm_bytes_per_s=1e15)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return CalibratedChip(**fields, terms=CalibrationTerms(mxu_weight_load_cycles=load_cycles,
                                                           mxu_fill_drain_cycles=fill_cycles))


def test_a_skinny_matmul_waits_for_weights_and_pays_one_fill_and_drain():
    # m = 8 rows, k = n = 512: 16 weight tiles on 4 MXUs = 4 rounds. Streaming 8 rows is 8 cycles, but each
    # tile's 128 weight rows take 128: 4 x 128 ns + one 256-cycle fill/drain = 768 ns (the roofline alone: 32 ns).
    assert kernel_cost(mm(1, 8, 512, 512), shaped_chip()).compute_s == pytest.approx(768e-9)
    assert kernel_cost(mm(1, 8, 512, 512), shaped_chip(0.0, 0.0)).compute_s == pytest.approx(32e-9)


def test_a_tall_matmul_hides_the_weight_loads_and_pays_only_the_bubble():
    # m = 4096 >= 128: 4 rounds x 4096 cycles + 256 cycles of fill and drain.
    cost = kernel_cost(mm(1, 4096, 512, 512), shaped_chip())
    assert cost.compute_s == pytest.approx((4 * 4096 + 256) * 1e-9)
    assert cost.compute_s / kernel_cost(mm(1, 4096, 512, 512), shaped_chip(0.0, 0.0)).compute_s < 1.02


def test_int8_streams_twice_as_fast_so_its_weight_floor_reaches_twice_the_rows():
    chip = shaped_chip(fill_cycles=0.0)
    # m = 128: bf16 streams in 128 cycles = the load; int8 would stream in 64 but still waits 128 for weights.
    assert kernel_cost(mm(1, 128, 512, 512, "int8"), chip).compute_s == pytest.approx(
        kernel_cost(mm(1, 128, 512, 512), chip).compute_s)
    # m = 1024: both hide the load and int8 takes half the time.
    assert kernel_cost(mm(1, 1024, 512, 512, "int8"), chip).compute_s == pytest.approx(
        kernel_cost(mm(1, 1024, 512, 512), chip).compute_s / 2)
