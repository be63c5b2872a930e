"""The ``torch_tpu`` package (tpusim's stand-in for TorchTPU's): every module path TorchTPU's scripts import exists,
and each name does what TorchTPU documents. The truth: TorchTPU's source and docs (signatures, members, errors,
file layout), JAX on CPU for ``jax_op``, closed-form tolerance arithmetic for ``assert_close``."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import tpusim
from tpusim.backend.program_trace import recorder
from tpusim.errors import TpusimError

MODULES = ("torch_tpu", "torch_tpu.api", "torch_tpu.profiler", "torch_tpu._internal.execution_mode",
           "torch_tpu._internal.sync", "torch_tpu._internal.sync.sync", "torch_tpu._internal.profiler",
           "torch_tpu._internal.pallas", "torch_tpu._internal.pallas.pallas", "torch_tpu._internal.utils.utils",
           "torch_tpu._internal.utils.test_utils", "torch_tpu._internal.utils.log_utils",
           "torch_tpu._internal.precision", "torch_tpu._internal.compile",
           "torch_tpu._internal.device._device_module", "torch_tpu._internal.distributed.multiprocessing",
           "torch_tpu._internal.distributed.launchers.singlehost_wrapper",
           "torch_tpu._internal.distributed.launchers.multihost_wrapper",
           "torch_tpu.shims.g3_multiprocessing.g3_multiprocessing",
           "torch_tpu._internal.shims.pyglib.contrib.g3_multiprocessing.g3_multiprocessing")


@pytest.fixture(autouse=True)
def _strict() -> Iterator[None]:
    tpusim.set_eager_mode("strict")
    yield
    tpusim.set_eager_mode("strict")


@pytest.mark.parametrize("name", MODULES)
def test_every_module_torchtpu_scripts_import_exists(name):
    assert importlib.import_module(name).__doc__


def test_tpu_device_is_the_tpu_device_cached_as_torchtpus():
    from torch_tpu import api

    api.tpu_device.cache_clear()                 # TorchTPU's notebooks call it (functools.lru_cache)
    assert api.tpu_device() == torch.device("tpu") and api.tpu_device(1) == torch.device("tpu", 1)
    assert torch.ones(2, device=api.tpu_device()).device.type == "tpu"
    with pytest.raises(TpusimError, match="_xla_cuda_device"):
        api._xla_cuda_device()


def test_execution_mode_is_torchtpus_enum_and_switches():
    from torch_tpu._internal import execution_mode as em

    assert {"DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_AND_FUSE"} <= set(em.EagerMode.__members__)
    assert em.get_eager_mode() is em.EagerMode.DEFER_NEVER
    with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):
        assert em.get_eager_mode() is em.EagerMode.DEFER_AND_FUSE
        with em.eager_mode(em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
            assert torch.tpu.get_eager_mode() is em.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        assert em.get_eager_mode() is em.EagerMode.DEFER_AND_FUSE
    assert em.get_eager_mode() is em.EagerMode.DEFER_NEVER
    em.eager_mode = em.EagerMode.DEFER_AND_FUSE          # the notebook's global switch
    assert tpusim.get_eager_mode() == "fused" and callable(em.eager_mode)
    with em.cpu_fallback_mode(True):
        pass


def test_synchronize_takes_tensors_lists_or_nothing():
    from torch_tpu._internal import sync

    x = torch.ones(3, device="tpu")
    sync.synchronize(x)
    sync.synchronize([x, x * 2], wait=True)
    sync.synchronize()
    assert sync.is_materialized(x) and sync.is_ready(x) and not sync.is_bufferless_zero_size(x)
    with pytest.raises(TpusimError, match="expected tensors"):
        sync.synchronize(["x"])


def test_computation_mlir_shows_the_pending_add_only_while_it_is_pending():
    from torch_tpu._internal import execution_mode as em
    from torch_tpu._internal.sync import sync

    with em.set_eager_mode(em.EagerMode.DEFER_AND_FUSE):
        x = torch.ones((2, 2), device="tpu")
        z = (x + 1) * 2
        assert not sync.is_materialized(z)
        text = sync.computation_mlir(z)
        assert "stablehlo.add" in text and "stablehlo.multiply" in text and "tensor<2x2xf32>" in text
        assert "aten::add.Tensor" in sync.computation_graphviz(z)
        assert z.sum().item() == 16.0                  # a host read materializes
        assert sync.is_materialized(z) and "stablehlo.add" not in sync.computation_mlir(z)
    with em.set_eager_mode(em.EagerMode.DEFER_NEVER):   # Strict eager: nothing is ever pending
        assert "stablehlo.add" not in sync.computation_mlir(torch.ones(2, device="tpu") + 1)


def test_jax_op_equals_the_jax_function_on_cpu_and_records_one_opaque_op():
    import jax
    import jax.numpy as jnp

    from torch_tpu._internal import pallas

    def scaled_tanh(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.tanh(x) * y, x - y

    op = pallas.jax_op("tpusim_test_pkg::scaled_tanh", scaled_tanh)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    want = [np.asarray(a) for a in scaled_tanh(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))]
    with recorder.recording() as rec:
        a, b = op(x.to("tpu"), y.to("tpu"))
    assert a.device.type == "tpu" and np.array_equal(a.cpu().numpy(), want[0]) and np.array_equal(b.cpu().numpy(),
                                                                                                 want[1])
    ops = [r for r in rec.trace.records if r.kind == "op" and r.op.startswith("tpusim_test_pkg")]
    assert [(r.op, r.family, r.bytes_read, r.bytes_written) for r in ops] == \
        [("tpusim_test_pkg::scaled_tanh", "opaque", 2 * 48.0, 2 * 48.0)]
    assert op._opoverload._schema.returns.__len__() == 2     # typed from the tuple annotation


def test_jax_op_reads_its_schema_from_annotations_as_torchtpu():
    import jax

    from tpusim.backend.torchtpu.pallas import schema_of

    def f(x: jax.Array, bias: jax.Array | None = None, *, scale: float = 1.0) -> jax.Array:
        return x

    assert schema_of("ns::f", f) == "(Tensor x, Tensor? bias=None, *, float scale=1.0) -> Tensor"

    def unannotated_return(x):
        return x

    with pytest.raises(TpusimError, match="return annotation"):
        schema_of("ns::g", unannotated_return)
    with pytest.raises(TpusimError, match="spell the parameters out"):
        schema_of("ns::h", lambda *xs: xs)


@pytest.mark.slow
def test_jax_op_runs_a_pallas_kernel_interpreted():
    import jax
    from jax.experimental import pallas as pl

    from torch_tpu._internal import pallas

    def double_kernel(i_ref, o_ref):
        o_ref[...] = i_ref[...] * 2.0

    def double(x: jax.Array) -> jax.Array:
        return pl.pallas_call(double_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    op = pallas.jax_op("tpusim_test_pkg::double", double)
    assert torch.equal(op(torch.tensor([10.0, 20.0, 30.0], device="tpu")).cpu(), torch.tensor([20.0, 40.0, 60.0]))


@pytest.mark.parametrize("flavour", ["utils", "test_utils"])
def test_assert_close_passes_and_fails_where_torchtpus_bounds_say(flavour):
    from torch_tpu._internal.utils import test_utils, utils

    check = (utils if flavour == "utils" else test_utils).assert_close
    strict, skip = utils.CheckValueMode.STRICT, utils.CheckValueMode.SKIP
    e = torch.ones(4)
    a = e + 1.5e-3                                           # loose bound 1e-3 + 1e-3 * 1 = 2e-3: passes
    check(a.to("tpu"), e, rtol=1e-3, atol=1e-3)
    with pytest.raises(AssertionError, match="Tolerance suggestions"):
        check(a, e, rtol=1e-3, atol=1e-3, check_value=strict)  # strict: 1.5e-3 > atol alone
    with pytest.raises(AssertionError, match="step 3"):
        check(e + 3e-3, e, rtol=1e-3, atol=1e-3, preamble="step 3")
    check(e + 100, e, check_value=skip)                      # values skipped, shapes and dtypes not
    with pytest.raises(AssertionError, match="shape mismatch"):
        check(torch.ones(3), e, check_value=skip)
    with pytest.raises(AssertionError, match="dtype mismatch"):
        check(e.double(), e)
    check(e.double(), e, check_dtype=False)
    check([e, e], (e, e))                                     # sequences pairwise
    check(None, None)
    check(a, e, atol=lambda expected: 2e-3 * abs(expected))  # a tolerance per expected value
    with pytest.raises(AssertionError, match="not close at 4 indices"):
        check(a, e, atol=lambda expected: 1e-3)
    if flavour == "test_utils":
        with pytest.raises(ValueError, match="LOOSE mode is the default"):
            check(a, e, check_value=utils.CheckValueMode.LOOSE)
        assert test_utils.compute_optimal_tolerances(torch.tensor([0.5, 4.0]), torch.tensor([0.0, 2.0])) == \
            pytest.approx((0.6, 1.2))                       # |e|<=1 sets atol, the rest rtol, times 1.2


def test_op_tracer_counts_the_ops_of_its_block_and_format_model_describes():
    from torch_tpu._internal.utils import utils

    x = torch.ones(3, device="tpu")
    with utils.OpTracer() as tracer:
        (x + 1) * 2 + 3
    assert tracer.ops_log["aten"] == {"aten.add.Tensor": 2, "aten.mul.Tensor": 1} and tracer.num_atens() == 3
    tracer2 = utils.OpTracer()
    tracer2(lambda t: t.sin())(x)                            # as a decorator
    assert tracer2.ops_log["aten"] == {"aten.sin.default": 1}
    text = utils.format_model(torch.nn.Linear(4, 2), torch.ones(1, 4), params=True, pt=True, aten=True)
    assert "Parameters: 10, Trainable: 10" in text and "Linear(in_features=4" in text and "aten.addmm" in text


def test_profile_checks_its_arguments_and_prices_a_recorded_block(tmp_path, monkeypatch):
    from torch_tpu._internal import profiler
    from tpusim.backend.torchtpu.profiler import simulated_trace

    assert profiler.xprof_trace_handler(dir_name=tmp_path)(None) == str(tmp_path)
    monkeypatch.setenv("TORCH_TPU_PROFILER_OUTPUT_DIR", str(tmp_path / "env"))
    assert profiler.xprof_trace_handler()(None) == str(tmp_path / "env")
    with pytest.raises(TpusimError, match="GPU"):
        with profiler.profile(activities=[profiler.ProfilerActivity.GPU], on_trace_ready=str):
            pass
    with pytest.raises(TpusimError, match="on_trace_ready"):
        with profiler.profile():
            pass
    with recorder.recording():
        torch.ones(64, 64, device="tpu").matmul(torch.ones(64, 64, device="tpu"))
        records = recorder.recorded()
    events = simulated_trace(records)["traceEvents"]
    assert any(e.get("ph") == "X" and "mm" in e["name"] and e["dur"] > 0 for e in events)


@pytest.mark.slow
def test_profile_writes_traces_where_the_handler_says(tmp_path):
    from torch_tpu._internal import profiler

    handler = profiler.xprof_trace_handler(dir_name=tmp_path)
    with recorder.recording():
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.TPU],
                              on_trace_ready=handler) as prof:
            torch.ones(64, 64, device="tpu").matmul(torch.ones(64, 64, device="tpu"))
    assert prof is None
    [folder] = (tmp_path / "plugins" / "profile").iterdir()
    host = json.loads(next(folder.glob("*.pt.trace.json")).read_text())
    simulated = json.loads(next(folder.glob("*.tpusim.trace.json")).read_text())
    assert any("aten::mm" in str(e.get("name")) for e in host["traceEvents"])
    assert any(e.get("ph") == "X" and "mm" in e["name"] for e in simulated["traceEvents"])


def test_singlehost_wrapper_sets_only_unset_launch_variables(monkeypatch, capsys):
    from torch_tpu._internal.distributed.launchers import singlehost_wrapper

    for key in ("TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_XPROF_SESSION_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TORCH_TPU_XPROF_SESSION_ID", "42")
    env = singlehost_wrapper.prepare_tpu_environment(world_size=2)
    assert env["TORCH_TPU_XPROF_SESSION_ID"] == "42" == os.environ["TORCH_TPU_XPROF_SESSION_ID"]
    assert os.environ["TORCH_TPU_TOPOLOGY"] == "2,1,1"
    assert len(os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == 2
    singlehost_wrapper.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("=")[0] for line in lines] == ["TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES",
                                                       "WORLD_SIZE"]
    assert lines[2] == f"WORLD_SIZE={torch.tpu.device_count()}"


def test_handle_main_exits_with_mains_value_and_device_module_is_torch_tpu():
    from torch_tpu._internal.device import _device_module
    from torch_tpu.shims.g3_multiprocessing import g3_multiprocessing

    with pytest.raises(SystemExit) as done:
        g3_multiprocessing.handle_main(lambda argv: 3, ["prog"])
    assert done.value.code == 3
    assert g3_multiprocessing.handle_test_main(lambda a, b: a + b, 1, b=2) == 3
    module = _device_module.DeviceModule
    assert module.is_initialized() and module.device_count() == torch.tpu.device_count()
    module._shutdown_runtime()
    module._init_runtime_options(device_type="tpu")
    assert module.get_device_name() == torch.tpu.get_device_name()
