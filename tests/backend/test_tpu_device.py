"""Device basics: plain tensors on "tpu", views and aliasing, out= resizing, generators,
several devices, streams/events, storage resize, mixed-device errors, save/load, autocast,
and the Dynamo/Inductor takeover."""

from __future__ import annotations

import io

import pytest
import torch

import tpusim.backend  # noqa: F401


def test_plain_tensor_on_tpu() -> None:
    x = torch.empty(3, device="tpu")
    assert type(x) is torch.Tensor
    assert x.device == torch.device("tpu:0")
    assert x.is_tpu
    assert torch.tpu.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"


def test_arithmetic_matches_cpu() -> None:
    a = torch.randn(5, 7)
    b = torch.randn(7, 3)
    got = (a.tpu() @ b.tpu()).relu().sum(0).cpu()
    torch.testing.assert_close(got, (a @ b).relu().sum(0))


def test_views_alias_device_memory() -> None:
    a = torch.zeros(4, 6, device="tpu")
    v = a[1:3, ::2]
    v.fill_(1.0)
    assert v._base is a
    assert v.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    t = a.t()
    t[0, 1] = 5.0
    expected = torch.zeros(4, 6)
    expected[1:3, ::2] = 1.0
    expected[1, 0] = 5.0
    torch.testing.assert_close(a.cpu(), expected)
    u = a.unfold(1, 2, 2)
    assert u.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()


def test_out_resizing() -> None:
    torch.testing.assert_close(torch.arange(6, device="tpu").cpu(), torch.arange(6))
    out = torch.empty(0, device="tpu")
    torch.add(torch.ones(3, device="tpu"), 1, out=out)
    assert out.shape == (3,)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))
    out2 = torch.empty(2, 2, device="tpu")
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(torch.ones(5, device="tpu"), 3, out=out2)
    assert out2.shape == (5,)
    torch.testing.assert_close(out2.cpu(), torch.full((5,), 3.0))


@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reduced_losses_do_not_warn_about_resizing(loss: str, reduction: str) -> None:
    """Their CPU out= kernels resize a 0-dim out twice (and warn); the tpu device must not."""
    import warnings

    fn = getattr(torch.nn.functional, loss)
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
    ta = a.detach().to("tpu").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(ta, b.to("tpu"), reduction=reduction)
        got.sum().backward()
    want = fn(a, b, reduction=reduction)
    want.sum().backward()
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(ta.grad.cpu(), a.grad)
    out = torch.empty(5, device="tpu")                  # a wrong out still resizes and warns, as on CPU
    with pytest.warns(UserWarning, match="was resized"):
        getattr(torch._C._nn, loss)(ta.detach(), b.to("tpu"), 1, out=out)
    assert out.shape == ()


def test_zero_tensor_gradients_are_real_memory() -> None:
    """sgn's gradient is an "efficient zero tensor" (bytes, null data); it used to segfault when read."""
    x = torch.randn(5, device="tpu", requires_grad=True)
    x.sgn().sum().backward()
    assert not x.grad._is_zerotensor()
    torch.testing.assert_close(x.grad.cpu(), torch.zeros(5))
    z = torch.ops.aten._efficientzerotensor([2, 3], device="tpu")
    torch.testing.assert_close((z + 1).cpu(), torch.ones(2, 3))


def test_in_place_returns_same_tensor() -> None:
    x = torch.ones(3, device="tpu")
    y = x.add_(1)
    assert y is x
    torch.testing.assert_close(x.cpu(), torch.full((3,), 2.0))


def test_item_and_print() -> None:
    x = torch.tensor([1.5, 2.5], device="tpu")
    assert x.sum().item() == 4.0
    assert "device='tpu:0'" in repr(x)


def test_generators_match_cpu_with_same_seed() -> None:
    torch.manual_seed(123)
    a = torch.randn(5, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.randn(5)
    torch.testing.assert_close(a, b)
    g = torch.Generator(device="tpu")
    assert g.device.type == "tpu"
    g.manual_seed(7)
    c = torch.rand(4, device="tpu", generator=g).cpu()
    g.manual_seed(7)
    d = torch.rand(4, device="tpu", generator=g).cpu()
    torch.testing.assert_close(c, d)
    state = torch.tpu.get_rng_state()
    e = torch.rand(3, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    torch.testing.assert_close(torch.rand(3, device="tpu").cpu(), e)


def test_tpu_draws_from_its_own_stream_as_the_docs_say() -> None:
    # docs/device.md: a draw on CPU does not advance "tpu"'s generator (the README once said a seeded script
    # draws on "tpu" what it draws on CPU, which holds only when every draw is on "tpu").
    torch.manual_seed(5)
    cpu_first = torch.randn(4)
    mixed = torch.randn(4, device="tpu").cpu()          # tpu's stream starts at the seed: CPU's first draw
    torch.testing.assert_close(mixed, cpu_first)
    torch.manual_seed(5)
    torch.randn(4)
    assert not torch.equal(torch.randn(4), mixed)       # CPU's second draw is another number


def test_dropout_reproducible() -> None:
    torch.manual_seed(5)
    a = torch.nn.functional.dropout(torch.ones(100, device="tpu"), 0.5).cpu()
    torch.manual_seed(5)
    b = torch.nn.functional.dropout(torch.ones(100, device="tpu"), 0.5).cpu()
    torch.testing.assert_close(a, b)


def test_several_devices() -> None:
    n = torch.tpu.device_count()
    assert n >= 2, "v5p has 4 chips per host"
    x = torch.ones(2, device=f"tpu:{n - 1}")
    assert x.device.index == n - 1
    assert (x + x).device.index == n - 1
    with torch.tpu.device(1):
        assert torch.tpu.current_device() == 1
        assert torch.empty(1, device="tpu").device.index == 1
    assert torch.tpu.current_device() == 0
    y = x.to("tpu:0")
    assert y.device.index == 0
    with pytest.raises(RuntimeError, match="same device"):
        _ = x + torch.ones(2, device="tpu:0")
    with pytest.raises(RuntimeError, match="invalid device"):
        torch.empty(1, device=f"tpu:{n}")


def test_mixed_cpu_and_tpu_inputs_error_like_cuda() -> None:
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="tpu") + torch.ones(3)
    # CPU scalars (0-dim) are allowed, as on CUDA
    torch.testing.assert_close((torch.ones(3, device="tpu") * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    # CPU indices are allowed for indexing, as on CUDA
    x = torch.arange(5.0, device="tpu")
    torch.testing.assert_close(x[torch.tensor([0, 2])].cpu(), torch.tensor([0.0, 2.0]))


def test_streams_and_events() -> None:
    s = torch.tpu.Stream()
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream().stream_id == s.stream_id
        torch.ones(4, device="tpu").sum()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    torch.ones(64, 64, device="tpu").mm(torch.ones(64, 64, device="tpu"))
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert end.query()
    torch.tpu.synchronize()
    torch.accelerator.synchronize()


def test_storage_resize_keeps_identity() -> None:
    x = torch.arange(4.0, device="tpu")
    st = x.untyped_storage()
    st.resize_(0)
    assert st.nbytes() == 0
    st.resize_(16)
    assert st.nbytes() == 16
    x.copy_(torch.ones(4))
    assert x.untyped_storage().nbytes() == 16


def test_memory_stats() -> None:
    torch.tpu.reset_peak_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.empty(1024, 1024, device="tpu")
    assert torch.tpu.memory_allocated() - before == 4 * 1024 * 1024
    assert torch.tpu.max_memory_allocated() >= before + 4 * 1024 * 1024
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    free, total = torch.tpu.mem_get_info()
    assert total == torch.tpu.get_device_properties().total_memory > 0
    assert free == total - torch.tpu.memory_allocated()
    del x
    assert torch.tpu.memory_allocated() == before
    assert torch.tpu.get_device_name().startswith("TPU ")


def test_save_load_round_trip() -> None:
    model = torch.nn.Linear(4, 3).tpu()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)
    assert state["weight"].device.type == "tpu"
    torch.testing.assert_close(state["weight"].cpu(), model.weight.cpu())
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    torch.testing.assert_close(on_cpu["bias"], model.bias.detach().cpu())


def test_module_tpu_and_tensor_tpu() -> None:
    m = torch.nn.Linear(2, 2).tpu()
    assert m.weight.device.type == "tpu"
    assert torch.ones(1).tpu(1).device == torch.device("tpu:1")


def test_autocast_bf16() -> None:
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a, b = torch.randn(4, 8, device="tpu"), torch.randn(8, 2, device="tpu")
    with torch.autocast("tpu"):
        mm = a @ b
        ex = torch.exp(mm)
    assert mm.dtype == torch.bfloat16
    assert ex.dtype == torch.float32
    torch.testing.assert_close(mm.float().cpu(), a.cpu() @ b.cpu(), atol=0.1, rtol=0.05)


def test_dynamo_interface_is_ours() -> None:
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import get_scheduling_for_device

    iface = get_interface_for_device("tpu")
    assert iface.__name__ == "TpusimInterface"
    assert iface.device_count() == torch.tpu.device_count()
    scheduling = get_scheduling_for_device("tpu")
    assert scheduling is not None and "pallas" not in repr(scheduling).lower()


def test_compile_aot_eager() -> None:
    fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager")
    x = torch.randn(8, device="tpu")
    torch.testing.assert_close(fn(x).cpu(), (x.cpu().sin() * 2).sum())


@pytest.mark.slow
def test_compile_inductor() -> None:
    fn = torch.compile(lambda x: (x.sin() * 2 + 1).relu())
    x = torch.randn(32, device="tpu")
    torch.testing.assert_close(fn(x).cpu(), (x.cpu().sin() * 2 + 1).relu())
