"""Settings read at import (TPUSIM_*): simulated HBM capacity and OOM, device count, the
float64 policy, shape-only mode. Each runs in a fresh interpreter."""

from __future__ import annotations

import warnings

import pytest
import torch

import tpusim.backend as tb


def test_out_of_memory_like_cuda(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend
        keep = torch.empty(3 * 2**20, dtype=torch.uint8, device="tpu")
        try:
            torch.empty(2 * 2**20, dtype=torch.uint8, device="tpu")
        except torch.OutOfMemoryError as err:
            print("OOM:", err)
        print("free", torch.tpu.mem_get_info()[0])
    """, env={"TPUSIM_HBM_BYTES": str(4 * 2**20)})
    assert proc.returncode == 0, proc.stderr
    assert "OOM: TPU out of memory. Tried to allocate 2.00 MiB" in proc.stdout
    assert "total HBM capacity of 4.00 MiB of which 1.00 MiB is free" in proc.stdout
    assert "3.00 MiB is allocated" in proc.stdout and "chip 'v5p'" in proc.stdout
    assert "free 1048576" in proc.stdout


def test_capacity_comes_from_chip_spec(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend
        from tpusim.hardware.spec import load_chip
        spec = load_chip("v5e")
        assert torch.tpu.mem_get_info()[1] == spec.hbm_bytes
        assert torch.tpu.device_count() == spec.chips_per_host
        print(torch.tpu.get_device_name())
    """, env={"TPUSIM_CHIP": "v5e"})
    assert proc.returncode == 0, proc.stderr
    assert "v5e" in proc.stdout


def test_device_count_override(python: object) -> None:
    proc = python("import torch, tpusim.backend; print(torch.tpu.device_count())", env={"TPUSIM_DEVICES": "2"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"


def test_f64_warns_once_per_op() -> None:
    x = torch.ones(3, dtype=torch.float64, device="tpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.special.xlog1py(x, x)          # an op no other test runs in float64
        torch.special.xlog1py(x, x)
    hits = [w for w in caught if issubclass(w.category, tb.TpuFloat64Warning)]
    assert len(hits) == 1
    assert "aten::special_xlog1py" in str(hits[0].message)
    assert "aten::special_xlog1py" in tb.non_native_ops()
    torch.testing.assert_close((x * 2).cpu(), torch.full((3,), 2.0, dtype=torch.float64))


def test_f64_error_mode(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend
        x = torch.ones(3, dtype=torch.float64, device="tpu")
        print(x)                                   # printing is exempt
        try:
            x * 2
        except RuntimeError as err:
            print("ERR", err)
    """, env={"TPUSIM_F64": "error"})
    assert proc.returncode == 0, proc.stderr
    assert "ERR tpusim: aten::mul on float64 tensors at <string>:6" in proc.stdout
    assert "TPUSIM_F64=error" in proc.stdout


def test_shape_only_mode(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend as tb
        from torch import nn
        from tpusim.trace.records import OpRecord
        # about 12 GiB of parameters: far more than this machine could hold in numerics mode
        model = nn.Sequential(*[nn.Linear(16384, 16384, bias=False, device="tpu") for _ in range(12)])
        x = torch.randn(8, 16384, device="tpu")
        with tb.recording() as rec:
            loss = model(x).square().mean()
            loss.backward()
        ops = rec.trace.of_kind(OpRecord)
        print("mm", sum(o.op == "aten::mm" for o in ops), "flops", sum(o.flops for o in ops) > 1e11)
        print("peak", torch.tpu.max_memory_allocated() > 12 * 2**30)
        try:
            loss.item()
        except RuntimeError as err:
            print("ERR", err)
        try:
            print(loss)
        except RuntimeError as err:
            print("ERR2", "shape-only mode" in str(err))
        # storages have unique, non-null fake pointers (FSDP2 compares them); values stay unreadable
        ptrs = [p.untyped_storage().data_ptr() for p in model.parameters()]
        w = model[0].weight
        print("ptrs", all(ptrs), len(set(ptrs)) == len(ptrs), w[1].data_ptr() - w.data_ptr() == 16384 * 4)
        try:
            w.cpu()
        except RuntimeError as err:
            print("ERR3", "shape-only mode" in str(err))
    """, env={"TPUSIM_NUMERICS": "off", "TPUSIM_HBM_BYTES": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "flops True" in proc.stdout and "peak True" in proc.stdout
    assert "ERR tpusim: cannot read the value" in proc.stdout and "TPUSIM_NUMERICS=off" in proc.stdout
    assert "ERR2 True" in proc.stdout and "ptrs True True True" in proc.stdout and "ERR3 True" in proc.stdout


def test_autoload_can_be_disabled(python: object) -> None:
    proc = python("import torch; print(hasattr(torch, 'tpu'))", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.stdout.strip() == "False"
    proc = python("import torch; print(torch.empty(1, device='tpu').device)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "tpu:0"


@pytest.mark.parametrize("bad", ["TPUSIM_NUMERICS=maybe", "TPUSIM_F64=sometimes", "TPUSIM_F64=bogus",
                                 "TPUSIM_DEVICES=0", "TPUSIM_DEVICES=abc", "TPUSIM_DEVICES=2.5",
                                 "TPUSIM_HBM_BYTES=lots", "TPUSIM_HBM_BYTES=-5", "TPUSIM_TARGET=tpu",
                                 "TPUSIM_CHIP=v99"])
def test_bad_settings_are_named(python: object, bad: str) -> None:
    key, value = bad.split("=")
    proc = python("import tpusim.backend", env={key: value})
    assert proc.returncode != 0
    assert "TpusimError" in proc.stderr and f"{key}={value!r}" in proc.stderr
    assert "accepted" in proc.stderr or "available chips" in proc.stderr
    proc = python("import torch", env={key: value})       # the autoload warns, never breaks torch
    assert proc.returncode == 0
    assert f"{key}={value!r}" in proc.stderr


def test_bytes_may_be_written_as_a_float(python: object) -> None:
    proc = python("import torch, tpusim.backend; print(torch.tpu.mem_get_info()[1])", env={"TPUSIM_HBM_BYTES": "16e9"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "16000000000"
