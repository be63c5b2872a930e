"""TorchTPU's public API on the tpu device (tpusim/backend/torchtpu/): one test per name group of its ``torch.tpu``,
``torch.tpu.distributed``, ``torch.tpu.compiler`` and ``torch.tpu.ops`` tables, its environment variables, chip
names and c10d backend names. The truth: TorchTPU's documented behaviour (names, types, defaults, errors) and CPU
PyTorch for every number."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import tpusim
import tpusim.backend as tb
from tpusim.backend.plumbing.config import load_config
from tpusim.backend.torchtpu import hardware
from tpusim.backend.torchtpu import precision as precision_module
from tpusim.errors import TpusimError
from tpusim.hardware.spec import load_chip
from tpusim.trace.records import MatmulPrecision

TPU_ENV = ("TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_DEVICES_PER_HOST",
           "TPUSIM_DEVICES", "TPUSIM_DEVICE_CONFIG")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    """Strict mode, and no precision setting left behind for other tests' recordings."""
    tpusim.set_eager_mode("strict")
    yield
    tpusim.set_eager_mode("strict")
    state = precision_module._S
    state.stack.clear()
    state.allow_excess, state.touched, state.highest = None, False, precision_module.Precision.DEFAULT


# ---------------------------------------------------------------- torch.tpu: eager modes


def test_eager_mode_enum_property_and_context_manager() -> None:
    EagerMode = torch.tpu.EagerMode
    assert {m.name: m.value for m in EagerMode} == {"DEFER_NEVER": "strict", "DEFER_NEVER_AND_LAUNCH_BLOCKING": "debug",
                                                   "DEFER_AND_FUSE": "fused"}
    assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER                        # TorchTPU's default: Strict
    torch.tpu.eager_mode = EagerMode.DEFER_AND_FUSE                             # settable, process-wide
    assert tpusim.get_eager_mode() == "fused" and torch.tpu.get_eager_mode() == "fused"
    with torch.tpu.set_eager_mode(EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING) as mode:
        assert mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING and tpusim.get_eager_mode() == "debug"
    assert torch.tpu.eager_mode is EagerMode.DEFER_AND_FUSE                     # restored after the block
    with pytest.raises(ZeroDivisionError), torch.tpu.set_eager_mode("DEFER_NEVER"):
        _ = 1 / 0
    assert torch.tpu.eager_mode is EagerMode.DEFER_AND_FUSE                     # restored on error too
    torch.tpu.set_eager_mode(EagerMode.DEFER_NEVER)                             # a plain call switches for good
    assert tpusim.get_eager_mode() == "strict"
    with pytest.raises(TpusimError, match="unknown eager mode 'lazy'"):
        torch.tpu.eager_mode = "lazy"
    with pytest.raises(TpusimError, match="expected a torch.tpu.EagerMode member"):
        torch.tpu.set_eager_mode(3)


def test_numbers_are_the_same_in_every_mode() -> None:
    x = torch.randn(8, 8)
    outs = []
    for mode in torch.tpu.EagerMode:
        with torch.tpu.set_eager_mode(mode):
            outs.append((x.to("tpu") @ x.to("tpu")).relu().sum(0).cpu())
    assert all(torch.equal(o, (x @ x).relu().sum(0)) for o in outs)


# ---------------------------------------------------------------- torch.tpu: precision


def test_precision_is_recorded_as_the_f32_matmul_pass_count() -> None:
    Precision = torch.tpu.Precision
    assert [p.name for p in Precision] == ["DEFAULT", "HIGH", "HIGHEST"]
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with tb.recording() as rec:
        with torch.tpu.precision(Precision.HIGH):
            with torch.tpu.precision(Precision.HIGHEST):
                y = a.to("tpu") @ b.to("tpu")
            assert precision_module.current() is Precision.HIGH              # innermost block wins, then unwinds
    assert torch.equal(y.cpu(), a @ b)                                       # numbers stay CPU's f32
    assert rec.trace.meta.matmul_precision == MatmulPrecision("highest", 6, False)
    with pytest.raises(TpusimError, match="torch.tpu.precision"), torch.tpu.precision("HIGH"):
        pass


def test_a_program_that_never_sets_precision_records_nothing() -> None:
    with tb.recording() as rec:
        _ = torch.ones(2, device="tpu") * 2
    assert rec.trace.meta.matmul_precision is None


def test_allow_excess_precision_is_settable_on_torch_tpu_and_torch_backends_tpu() -> None:
    assert torch.tpu.allow_excess_precision is False                         # TorchTPU's default
    torch.backends.tpu.allow_excess_precision = True
    assert torch.tpu.allow_excess_precision is True
    with tb.recording() as rec:
        _ = torch.ones(2, device="tpu") + 1
    assert rec.trace.meta.matmul_precision == MatmulPrecision("default", 1, True)
    with pytest.raises(TpusimError, match="True or False"):
        torch.tpu.allow_excess_precision = "yes"


def test_xla_flags_give_the_default_of_allow_excess_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp --xla_allow_excess_precision=true")
    assert torch.tpu.allow_excess_precision is True
    precision_module._S.allow_excess = None
    monkeypatch.setenv("XLA_FLAGS", "--xla_allow_excess_precision=maybe")
    with pytest.raises(TpusimError, match="XLA_FLAGS: --xla_allow_excess_precision='maybe'; accepted: true, false"):
        _ = torch.tpu.allow_excess_precision


# ---------------------------------------------------------------- torch.tpu: compile-cache telemetry and HBM


def test_cache_stats_count_torch_compile_executions() -> None:
    pytest.importorskip("jax")
    fn = torch.compile(lambda t: torch.tanh(t) * 3, backend="tpu")
    before = torch.tpu._get_cache_stats()
    x = torch.randn(5, 3)
    fn(x.to("tpu"))
    fn(x.to("tpu"))
    fn(torch.randn(7, 3).to("tpu"))                      # new shapes: Dynamo and the cache compile again
    after = torch.tpu._get_cache_stats()
    assert after.num_cache_reqs - before.num_cache_reqs == 3
    assert after.num_cache_hits - before.num_cache_hits == 1
    assert torch.tpu._get_cache_requests() == after.num_cache_reqs
    assert torch.tpu._get_cache_hits() == after.num_cache_hits
    assert torch.tpu._get_cache_misses() == after.num_cache_reqs - after.num_cache_hits
    new = [e for e in after.per_entry_stats if e.key not in {b.key for b in before.per_entry_stats}]
    assert sorted(e.read_count for e in new) == [0, 1]
    assert all(isinstance(e.compilation_duration, dt.timedelta) and e.compilation_duration > dt.timedelta(0)
               for e in new)
    assert isinstance(next(e for e in new if e.read_count == 1).last_read, dt.datetime)
    assert "num_cache_reqs=" in str(after)
    torch.tpu._clear_cache()                             # evicted: the next execution compiles again
    assert torch.tpu._get_cache_stats().per_entry_stats == []
    hits = torch.tpu._get_cache_hits()
    fn(x.to("tpu"))
    assert torch.tpu._get_cache_hits() == hits and len(torch.tpu._get_cache_stats().per_entry_stats) == 1


def test_hbm_usage_summary_reads_the_simulated_hbm() -> None:
    keep = torch.empty(1024, 256, device="tpu")          # 1 MiB on tpu:0
    text = torch.tpu._hbm_usage_summary()
    assert text.startswith("CompilationCache HBM usage: 0B for ")
    allocated = torch.tpu.memory_allocated(0)
    assert f"tpu:0 HBM ({torch.tpu.get_device_name()}, simulated): " in text and allocated >= keep.nbytes
    assert "capacity 95.00GiB" in text                   # v5p: 95 GiB per device


# ---------------------------------------------------------------- torch.tpu: devices, chips and mesh layout


def test_device_names_and_properties_as_torchtpu_reports_them() -> None:
    assert torch.tpu.get_device_name() == "TPU v5p"
    props = torch.tpu.get_device_properties()
    assert (props.name, props.total_memory, props.multi_processor_count) == ("TPU v5p", load_chip("v5p").hbm_bytes, 1)
    attrs = torch.tpu.get_local_device_attributes()
    assert attrs == {"id": 0, "coords": (0, 0, 0), "core_on_chip": 0, "process_index": 0, "slice_index": 0,
                     "device_kind": "TPU v5", "platform": "tpu"}
    assert {torch.bfloat16, torch.float16} <= set(torch.tpu.get_amp_supported_dtype())


@pytest.mark.parametrize(("alias", "chip", "name"), [("tpu7x", "v7", "TPU v7"), ("Ironwood", "v7", "TPU v7"),
                                                     ("trillium", "v6e", "TPU v6e"), ("v5litepod", "v5e", "TPU v5e")])
def test_chip_aliases(alias: str, chip: str, name: str) -> None:
    spec = load_chip(alias)
    assert (spec.name, spec.display_name) == (chip, name)
    with pytest.raises(TpusimError, match="also accepted: ironwood, tpu7x, trillium, v5litepod"):
        load_chip("v9")


def test_v7_is_two_devices_per_chip_with_half_the_hbm_each(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend
        p = torch.tpu.get_device_properties()
        print(torch.tpu.get_device_name(), torch.tpu.device_count(), p.total_memory, torch.tpu.mem_get_info()[1])
        with torch.tpu.device(1):
            print(torch.tpu.get_local_device_attributes())
    """, env={"TPUSIM_CHIP": "ironwood", **{name: "" for name in (         # a whole host: no slice, no device list
        "TORCH_TPU_TOPOLOGY", "TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "TPUSIM_DEVICES", "TPUSIM_DEVICE_CONFIG")}})
    assert proc.returncode == 0, proc.stderr[-2000:]
    half = load_chip("v7").hbm_bytes // 2
    assert f"TPU v7 8 {half} {half}" in proc.stdout         # 4 chips per host x 2 devices
    assert "'core_on_chip': 1" in proc.stdout


def test_topology_aware_mesh_is_the_placement_rank_layout() -> None:
    layout = hardware.rank_layout((2, 2), 4)                # default placement on 2x2x1: the identity numbering
    assert layout.dtype == torch.int64 and layout.tolist() == [[0, 1], [2, 3]]
    with pytest.raises(TpusimError, match="mesh_shape .* holds 6 ranks but the world has 4"):
        hardware.rank_layout((2, 3), 4)
    with pytest.raises(RuntimeError, match="process group must be initialized"):
        torch.tpu.topology_aware_mesh((1,))
    assert torch.tpu.distributed.topology_aware_mesh is torch.tpu.topology_aware_mesh


def test_topology_aware_mesh_in_a_world(python: object) -> None:
    proc = python("""
        import torch, torch.distributed as dist
        dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=8)
        print(torch.tpu.topology_aware_mesh((1, 4), topology="multi_slice", dcn_mesh_shape=(2, 1)).tolist())
        print(torch.tpu.topology_aware_mesh((2, 2), topology="multi_slice", dcn_mesh_shape=(2, 1)).tolist())
        try:
            torch.tpu.topology_aware_mesh((8,))
        except Exception as err:
            print(type(err).__name__, err)
    """, env={"TPUSIM_RANKS": "one", "TORCH_TPU_TOPOLOGY": "2x2x1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[[0, 1, 2, 3], [4, 5, 6, 7]]" in proc.stdout          # 8 ranks: two slices of 2x2x1 ...
    assert "[[0, 1], [2, 3], [4, 5], [6, 7]]" in proc.stdout     # ... along the outer (DCN) dim
    assert "TpusimError topology_aware_mesh: the slice 2x2x1 (TORCH_TPU_TOPOLOGY) has 4 devices" in proc.stdout


# ---------------------------------------------------------------- environment variables


def _config(monkeypatch: pytest.MonkeyPatch, chip: str = "v5p", **env: str):
    for name in TPU_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_config(chip=load_chip(chip))


def test_torchtpu_variables_read_with_torchtpu_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(monkeypatch, TPU_VISIBLE_DEVICES="1", TPU_VISIBLE_CHIPS="0,1,2", TORCH_TPU_TOPOLOGY="2x2x1")
    assert (cfg.visible_devices, cfg.device_count, cfg.topology) == ((1,), 1, (2, 2, 1))   # DEVICES wins
    cfg = _config(monkeypatch, "v7", TPU_VISIBLE_CHIPS="1", TORCH_TPU_TOPOLOGY="2,2,1,2")
    assert (cfg.visible_devices, cfg.device_count, cfg.topology) == ((2, 3), 2, (2, 2, 1))  # a v7 chip: 2 devices
    cfg = _config(monkeypatch, "v6e", TORCH_TPU_TOPOLOGY="2,2,1", TORCH_TPU_DEVICES_PER_HOST="4")
    assert (cfg.topology, cfg.devices_per_host, cfg.device_count) == ((2, 2), 4, 4)
    cfg = _config(monkeypatch, TPUSIM_DEVICES="3", TPU_VISIBLE_DEVICES="0")
    assert (cfg.device_count, cfg.visible_devices) == (3, None)                             # TPUSIM_* wins


@pytest.mark.parametrize(("env", "message"), [
    ({"TORCH_TPU_TOPOLOGY": "2,2,1,2"}, "a fourth number gives the devices per chip, and v5p has 1"),
    ({"TORCH_TPU_TOPOLOGY": "2;2"}, "TORCH_TPU_TOPOLOGY='2;2'; accepted: chips along x, y, z"),
    ({"TPU_VISIBLE_DEVICES": "4"}, "TPU_VISIBLE_DEVICES='4'; accepted: distinct device ids 0..3"),
    ({"TPU_VISIBLE_DEVICES": "0,0"}, "TPU_VISIBLE_DEVICES='0,0'; accepted: distinct device ids"),
    ({"TPU_VISIBLE_CHIPS": "x"}, "TPU_VISIBLE_CHIPS='x'; accepted: distinct chip ids 0..3"),
    ({"TORCH_TPU_DEVICES_PER_HOST": "0"}, "TORCH_TPU_DEVICES_PER_HOST='0'; accepted: a whole number >= 1")])
def test_bad_torchtpu_variables_get_one_clear_error(monkeypatch: pytest.MonkeyPatch, env: dict, message: str) -> None:
    with pytest.raises(TpusimError, match=message.replace("(", r"\(")):
        _config(monkeypatch, **env)


def test_a_config_with_torchtpu_fields_travels_to_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(monkeypatch, "v7", TPU_VISIBLE_DEVICES="0,5", TORCH_TPU_TOPOLOGY="2x2x2")
    assert type(cfg).from_json(cfg.to_json()) == cfg


# ---------------------------------------------------------------- torch.tpu.distributed and c10d names


def test_c10d_backend_names() -> None:
    plugins = torch.distributed.Backend._plugins
    assert {"TPUSIM", "TPU_DIST", "TPU"} <= set(plugins)
    assert torch.distributed.Backend.default_device_backend_map["tpu"] == "tpusim"


def test_launch_env_and_window_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    d = torch.tpu.distributed
    for name in ("TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_XPROF_SESSION_ID"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(name, "")                  # restored after the test, whatever set_tpu_launch_env sets
    env = d.set_tpu_launch_env(nproc_per_node=4)
    assert env["TORCH_TPU_TOPOLOGY"] == "2,2,1" and len(env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == 4
    assert os.environ["TORCH_TPU_TOPOLOGY"] == "2,2,1"
    with pytest.raises(TpusimError, match="a v5p host has 4 devices"):
        d.set_tpu_launch_env(nproc_per_node=16)
    assert (d.window_num_stripes, d.window_stripe_chunk_mb) == (4, 8)      # TorchTPU's defaults
    torch.tpu.window_num_stripes = 2
    assert d.window_num_stripes == 2
    with pytest.raises(TpusimError, match="expected window_stripe_chunk_mb to be > 0, got 0"):
        d.window_stripe_chunk_mb = 0
    d.window_num_stripes = 4


def test_spmd_safe_runs_the_function() -> None:
    seen = []

    @torch.tpu.distributed.spmd_safe
    def step(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.tpu.distributed.in_spmd_safe_region())
        return x * 5

    x = torch.arange(3.0)
    assert torch.equal(step(x.to("tpu")).cpu(), x * 5) and seen == [True]
    assert not torch.tpu.distributed.in_spmd_safe_region()


def test_python_m_torch_tpu_distributed_prints_the_launch_variables() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_TPU_", "TPUSIM_"))}
    proc = subprocess.run([sys.executable, "-m", "torch.tpu.distributed", "--nproc_per_node", "2"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split("=", 1) for line in proc.stdout.split())
    assert lines["TORCH_TPU_TOPOLOGY"] == "2,1,1" and "TORCH_TPU_SLICEBUILDER_ADDRESSES" in lines
    proc = subprocess.run([sys.executable, "-m", "torch.tpu.distributed.environment", "--nproc_per_node=4"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and "TORCH_TPU_TOPOLOGY=2,2,1" in proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------- torch.tpu.compiler and torch.compile


def test_custom_compiler_options() -> None:
    from tpusim.backend.torchtpu import compiler

    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O1"}):
        with torch.tpu.compiler.custom_compiler_options({"xla_memory_fitting_level": "O0"}):
            y = torch.ones(2, device="tpu") * 2
            assert compiler.current() == {"xla_optimization_level": "O1", "xla_memory_fitting_level": "O0"}
    assert compiler.current() == {} and y.cpu().tolist() == [2.0, 2.0]
    with pytest.raises(TpusimError, match="expected a dict of XLA option name -> value"):
        with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": 1}):
            pass


def test_torch_compile_defaults_to_tpu_for_tpu_inputs_and_takes_torchtpu_options() -> None:
    pytest.importorskip("jax")
    from tpusim.backend.torch_compile import jax_backend

    debugs = []
    model = torch.nn.Linear(4, 3).to("tpu")
    graphs = len(jax_backend.compile_stats().graphs)
    compiled = torch.compile(model, options={"debug_callback": debugs.append, "name": "head", "async_compile": True,
                                             "num_dynamic_buckets": 2, "bucket_size": 128, "serializable": False})
    x = torch.randn(2, 4)
    out = compiled(x.to("tpu"))
    out.sum().backward()
    assert len(jax_backend.compile_stats().graphs) == graphs + 2        # forward and backward, by "tpu"
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    torch.testing.assert_close(out.cpu(), ref(x), atol=1e-6, rtol=1e-6)
    (debug,) = debugs
    assert repr(debug) == ("TpuCompileDebug(pre_fx=1, post_fwd_fx=1, post_bwd_fx=1, stablehlo_fwd=1, stablehlo_bwd=1, "
                           "executables=2)")
    assert "stablehlo" in debug.stablehlo_forward_text[0] and "=== StableHLO Backward ===" in str(debug)
    assert any(e.key.startswith("head: graph") for e in torch.tpu._get_cache_stats().per_entry_stats)
    assert torch.equal(torch.compile(lambda t: t * 2 + 1)(torch.ones(3)), torch.full((3,), 3.0))   # CPU: Inductor
    with pytest.raises(Exception, match="num_dynamic_buckets=9; accepted: a whole number 1..8"):
        torch.compile(model, backend="tpu", options={"num_dynamic_buckets": 9})(x.to("tpu"))


# ---------------------------------------------------------------- torch.tpu.ops


def test_splash_attention_is_one_op_with_cpu_numerics() -> None:
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    k, v = torch.randn(2, 2, 8, 16, requires_grad=True), torch.randn(2, 2, 8, 16, requires_grad=True)
    out = torch.tpu.ops.splash_attention(q, k, v)                       # on CPU: the reference
    out.sum().backward()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)             # it is attention (grouped, causal)
    qt, kt, vt = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
    with tb.recording() as rec:
        ot = torch.tpu.ops.splash_sdpa(qt, kt, vt, block_q=128, block_kv=128)
        ot.sum().backward()
    assert torch.equal(ot.cpu(), out) and torch.equal(qt.grad.cpu(), q.grad) and torch.equal(kt.grad.cpu(), k.grad)
    ops = [r.op for r in rec.trace.records if hasattr(r, "family")]
    assert ops.count("tpu::splash_attention") == 1 and ops.count("tpu::splash_attention_backward") == 1
    window = torch.tpu.ops.splash_attention(q.detach(), k.detach(), v.detach(), local_window_size=2)
    mask = torch.ones(8, 8, dtype=torch.bool).tril() & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)
    ref = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(window, ref, atol=1e-5, rtol=1e-5)


def test_ragged_dot_is_jax_ragged_dot() -> None:
    lhs, rhs = torch.randn(7, 3, requires_grad=True), torch.randn(3, 3, 5, requires_grad=True)
    sizes = torch.tensor([2, 0, 4])                                        # rows 0-1: rhs[0], 2-5: rhs[2], 6: none
    y = torch.tpu.ops.ragged_dot(lhs, rhs, sizes)
    expected = torch.cat([lhs[:2] @ rhs[0], lhs[2:6] @ rhs[2], torch.zeros(1, 5)])
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    lt, rt = lhs.detach().to("tpu").requires_grad_(), rhs.detach().to("tpu").requires_grad_()
    with tb.recording() as rec:
        yt = torch.tpu.ops.ragged_dot(lt, rt, sizes.to("tpu"))
        yt.sum().backward()
    assert torch.equal(yt.cpu(), y) and torch.equal(lt.grad.cpu(), lhs.grad) and torch.equal(rt.grad.cpu(), rhs.grad)
    assert {"tpu::ragged_dot", "tpu::ragged_dot_rhs_grad"} <= {r.op for r in rec.trace.records if hasattr(r, "family")}


def test_sparse_dense_matmul_family_is_an_embedding_lookup() -> None:
    table = torch.randn(10, 4, requires_grad=True)
    ids, samples = torch.tensor([1, 3, 3, 9, 0]), torch.tensor([0, 0, 1, 2, 2])
    gains = torch.tensor([1.0, 0.5, 2.0, 1.0, -1.0])
    out = torch.tpu.ops.sparse_dense_matmul(ids, samples, gains, table, 3)
    expected = torch.stack([table[1] + 0.5 * table[3], 2 * table[3], table[9] - table[0]])
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    tt = table.detach().to("tpu").requires_grad_()
    with tb.recording() as rec:
        coo = torch.tpu.ops.sparse_dense_matmul(ids.to("tpu"), samples.to("tpu"), gains.to("tpu"), tt, 3)
        csr = torch.tpu.ops.sparse_dense_matmul_csr(torch.tensor([0, 2, 3, 5]).to("tpu"), ids.to("tpu"),
                                                    gains.to("tpu"), tt)
        (coo.sum() + csr.sum()).backward()
    assert torch.equal(coo.cpu(), out) and torch.equal(csr.cpu(), out) and torch.equal(tt.grad.cpu(), 2 * table.grad)
    grad = torch.tpu.ops.sparse_dense_matmul_grad(torch.ones(3, 4), ids, samples, gains, 10)
    assert torch.equal(grad, table.grad)
    assert {"tpu::sparse_dense_matmul", "tpu::sparse_dense_matmul_csr", "tpu::sparse_dense_matmul_grad",
            "tpu::sparse_dense_matmul_grad_csr"} <= {r.op for r in rec.trace.records if hasattr(r, "family")}
    assert torch.equal(torch.tpu.ops.sparse_gather(table.detach().to("tpu"), ids.to("tpu")).cpu(), table[ids])
    x = torch.ones(2, device="tpu")
    assert torch.tpu.ops.optimization_barrier(x) is x


def test_tpu_ops_run_in_shape_only_mode(python: object) -> None:
    proc = python("""
        import torch, tpusim.backend as tb
        q = torch.empty(1, 2, 64, 32, device="tpu")
        with tb.recording() as rec:
            o = torch.tpu.ops.splash_attention(q, q, q)
            y = torch.tpu.ops.ragged_dot(torch.empty(6, 32, device="tpu"), torch.empty(2, 32, 8, device="tpu"),
                                         torch.empty(2, dtype=torch.int32, device="tpu"))
        print(list(o.shape), list(y.shape), [r.op for r in rec.trace.records if hasattr(r, "family")])
    """, env={"TPUSIM_NUMERICS": "off"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[1, 2, 64, 32] [6, 8] ['tpu::splash_attention', 'tpu::ragged_dot']" in proc.stdout


def test_names_that_need_hardware_exist_and_say_why() -> None:
    from torch.tpu.ops import send

    with pytest.raises(TpusimError, match=r"torch.tpu.ops.send\(\) does not run on tpusim: .*one-sided DMA"):
        send(torch.ones(1), 1)
    with pytest.raises(TpusimError, match=r"torch.tpu._set_cache_only\(\) does not run on tpusim"):
        torch.tpu._set_cache_only(True)
    with pytest.raises(AttributeError):
        _ = torch.tpu.ops.no_such_kernel


def test_every_c10d_name_of_tpusim_is_one_registered_backend() -> None:
    # tpusim's name and TorchTPU's two ("tpu_dist", "tpu"); the torchrun test trains under "tpu_dist" by default
    # and under "tpu" in the slow run (tests/distributed/test_torchtpu_launch.py).
    import torch.distributed as dist

    from tpusim.backend.device.registration import C10D_NAMES

    assert all(dist.is_backend_available(name) for name in C10D_NAMES)
    creators = {dist.Backend._plugins[name.upper()].creator_fn for name in C10D_NAMES}
    assert len(creators) == 1


def test_import_torch_tpu_registers_the_device_with_the_autoload_off() -> None:
    # issue 44, TT4: with TORCH_DEVICE_BACKEND_AUTOLOAD=0, `import torch_tpu` (which registers TorchTPU's device)
    # left "tpu" unknown to torch: the first device="tpu" got torch's "Expected one of cpu, ..."
    code = "import torch_tpu, torch\nprint('VALUE', (torch.ones(2, device='tpu') + 1).sum().item())\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert "VALUE 4.0" in done.stdout, done.stderr
