"""Cases from the JAX scaling book: collectives and one matmul, each priced alone on its slice.

Source: "How to Scale Your Model" (Austin et al.), jax-ml.github.io/scaling-book, read at upstream
commit ccff50b (2025-08-25). Rows C1-C10 and V18 of ../shared/research/validation-sources.md.

Which are measurements: C2 (a profile: 680 us), C9 (a measured bandwidth sweep: ~95% of the link at
~10 MB), C10 (a profile: 1.13 ms) and V18 (a profile: 96 ms). C1 and C4-C8 are the book's own
pen-and-paper answers (``kind="analytic"``): formula checks, reported apart from the fidelity error.

Held out for good and absent here: the book's latency-bound small-message all-gather measured on
v5e (Pop Quiz 2, part 2).

Every size below is V in tpusim's sense (``tpusim.network.collectives``): all_gather = output bytes per chip,
reduce_scatter = input bytes per chip, all_reduce = the buffer, permute = what each chip sends.
"""

from __future__ import annotations

from tpusim.hardware.compute import kernel_cost
from tpusim.hardware.spec import ChipSpec
from tpusim.network.collectives import algorithm_cost, simulate_collective
from tpusim.network.collectives.groups import resolve
from tpusim.slice.topology import build_slice
from tpusim.trace.cost_rules import Meta
from tpusim.trace.ops import op_cost
from tpusim.trace.records import OpRecord
from tpusim.validate.case import Case, Prediction

BOOK = "https://jax-ml.github.io/scaling-book"
SHARDING = f"{BOOK}/sharding/"
TPUS = f"{BOOK}/tpus/"
PROFILING = f"{BOOK}/profiling/"

# bf16[E_Y, F] with E = 2048, F = 8192 (Pop Quiz 2): the gathered array
POP_QUIZ_2_BYTES = 2048 * 8192 * 2
# Sharding Question 2: B = 1024, D = 4096 bf16 on a 4x4x4 mesh {X: 4, Y: 4, Z: 4}
Q2_B, Q2_D = 1024, 4096


def _collective(topology: str, kind: str, nbytes: float, *, axes=None, group=None,
                wrap: tuple[bool, ...] | None = None):
    """A predictor: ``kind`` of ``nbytes`` alone on ``topology`` (the chip it is given), DES time, with
    the closed form's split into hop latency, bandwidth and start-up."""

    def predict(chip: ChipSpec) -> Prediction:
        slice_ = build_slice(topology, chip=chip, wrap=wrap)
        result = simulate_collective(slice_, kind, nbytes, axes=axes, group=group)
        cost = algorithm_cost(resolve(slice_, kind, nbytes, axes, group), result.algorithm)
        parts = {"hop latency": cost.latency_s, "bandwidth": cost.transfer_s,
                 "start-up": chip.collective_overhead_ns * 1e-9 + cost.overhead_s,
                 "DES - closed form": result.time_s - result.closed_form_s}
        notes = (f"{kind} of {nbytes:,.0f} B over {result.group_size} chips ({','.join(result.axes) or 'group'}) "
                 f"on {slice_.spec} (wrap {slice_.wrap}), {chip.name}",
                 f"algorithm {result.algorithm}: {result.reason}",
                 f"one ICI link {chip.ici_link_bytes_per_s / 1e9:.4g} GB/s one way, "
                 f"{chip.ici_hop_latency_ns:g} ns per hop, start-up {chip.collective_overhead_ns:g} ns",
                 *([result.simulated] if result.simulated else ()))
        return Prediction(result.time_s, parts, notes)

    return predict


def _matmul(m: int, k: int, n: int):
    """A predictor: one bf16 matmul [m, k] x [k, n] on one chip (``tpusim.hardware.compute.kernel_cost``)."""

    def predict(chip: ChipSpec) -> Prediction:
        x, w, out = Meta((m, k), "bfloat16", 2), Meta((k, n), "bfloat16", 2), Meta((m, n), "bfloat16", 2)
        mm = op_cost("aten::mm", [x, w], [out], (x, w))     # the backend's rule for the op
        op = OpRecord(seq=0, op="aten::mm", unit=mm.unit, dtype="bfloat16", flops=mm.flops,
                      bytes_read=float(x.nbytes + w.nbytes), bytes_written=float(out.nbytes), matmul=mm.matmul,
                      family=str(mm.family))
        cost = kernel_cost(op, chip)
        parts = {"compute (mxu)" if cost.bound != "hbm" else "compute (hidden)": cost.compute_s,
                 "memory beyond compute": max(0.0, cost.memory_s - cost.compute_s), "launch": cost.launch_s}
        notes = (f"[{m}, {k}] x [{k}, {n}] bf16 on one {chip.display_name}: {cost.flops:.4g} FLOPs, "
                 f"{cost.bytes / 1e6:.4g} MB of HBM traffic, bound by {cost.bound}",
                 f"MXU utilisation {cost.mxu_utilisation:.1%} of {chip.peak_bf16_flops_per_s / 1e12:.4g} TFLOP/s")
        return Prediction(cost.seconds, parts, notes)

    return predict


CASES: tuple[Case, ...] = (
    Case(
        name="sb-c1-allgather-v5e-wrapped-ideal", kind="analytic",
        title="AllGather_Y of bf16[E_Y, F] (34 MB) on v5e {X:8, Y:4}, the book's wrapped-ring ideal",
        chip="v5e", slice="2d:8x4 with a wraparound forced on Y (the book's idealisation)",
        setup="mesh {X: 8, Y: 4}; E = 2048, F = 8192, bf16; gather over Y",
        published="377 us (34e6 / 9e10, bidirectional ring)", published_s=377e-6,
        source=SHARDING, where="'Sharded Matrices', Pop Quiz 2 [AllGather time], answer part (1), first estimate",
        predict=_collective("2d:8x4", "all_gather", POP_QUIZ_2_BYTES, axes=("y",), wrap=(False, True)),
        model="bidirectional ring on a wrapped 4-axis (the book's formula V / W_ici assumes one)"),
    Case(
        name="sb-c2-allgather-v5e-4x8-profile", kind="measured",
        title="AllGather_Y of bf16[E_Y, F] (34 MB) on v5e {X:8, Y:4}: profiled",
        chip="v5e", slice="2d:8x4 (Y, of length 4, has no wraparound on v5e)",
        setup="mesh {X: 8, Y: 4}; E = 2048, F = 8192, bf16; gather over Y",
        published="680 us (profile; the book predicts 560 us)", published_s=680e-6,
        source=SHARDING, where="'Sharded Matrices', Pop Quiz 2 [AllGather time], answer part (1): 'an actual "
                                "profile ... shows 680 us'",
        predict=_collective("2d:8x4", "all_gather", POP_QUIZ_2_BYTES, axes=("y",)),
        model="the cheapest of tpusim's algorithms on a 4-chip line (no wraparound): 3 steps of one 8.4 MB "
              "shard each way"),
    Case(
        name="sb-c4-allgather-x-v4-4x4x4", kind="analytic",
        title="AllGather_X([B_X, D_Y]) on v4 4x4x4, B = 1024, D = 4096 bf16",
        chip="v4", slice="3d:4x4x4 (a full cube: every axis wraps)",
        setup="mesh {X: 4, Y: 4, Z: 4}; gather over X of the local column (2BD/Y bytes)",
        published="23 us (2BD / (Y x 9e10))", published_s=23e-6,
        source=SHARDING, where="'Sharded Matrices', Question 2 [AllGather latency], answer 1",
        predict=_collective("3d:4x4x4", "all_gather", 2 * Q2_B * Q2_D / 4, axes=("x",))),
    Case(
        name="sb-c5-allgather-xy-v4-4x4x4", kind="analytic",
        title="AllGather_XY([B_X, D_Y]) on v4 4x4x4, B = 1024, D = 4096 bf16",
        chip="v4", slice="3d:4x4x4", setup="gather over X and Y of the whole array (2BD bytes)",
        published="46 us (2BD / (2 x 9e10))", published_s=46e-6,
        source=SHARDING, where="'Sharded Matrices', Question 2 [AllGather latency], answer 2",
        predict=_collective("3d:4x4x4", "all_gather", 2 * Q2_B * Q2_D, axes=("x", "y"))),
    Case(
        name="sb-c6-allreduce-z-v4-4x4x4", kind="analytic",
        title="AllReduce_Z([B_X, D_Y] {U_Z}) on v4 4x4x4, B = 1024, D = 4096 bf16",
        chip="v4", slice="3d:4x4x4", setup="all-reduce over Z of the local block (2BD/(XY) bytes)",
        published="11.6 us (4BD / (XY x 9e10))", published_s=11.6e-6,
        source=SHARDING, where="'Sharded Matrices', Question 2 [AllGather latency], answer 3",
        predict=_collective("3d:4x4x4", "all_reduce", 2 * Q2_B * Q2_D / 16, axes=("z",))),
    Case(
        name="sb-c7-allgather-tiny-v4-4x4x4", kind="analytic",
        title="AllGather_X([B_X]) on v4 4x4x4, B = 128 bf16 (64 B per chip): latency-bound estimate",
        chip="v4", slice="3d:4x4x4", setup="gather over X of 64 B shards (256 B gathered)",
        published="~2 us (2 hops x 1 us)", published_s=2e-6,
        source=SHARDING, where="'Sharded Matrices', Question 3 [latency-bound AllGather], answer",
        predict=_collective("3d:4x4x4", "all_gather", 256, axes=("x",)),
        model="latency-bound: hops x hop latency plus the collective's start-up cost (calibrated)"),
    Case(
        name="sb-c8-send-v5e-4x4", kind="analytic",
        title="Send bf16[8, 128, 8192] (16.8 MB) from chip (0,0) to (3,3) on v5e 4x4",
        chip="v5e", slice="2d:4x4 (no wraparound)", setup="one point-to-point transfer, 6 hops apart",
        published="194 us (1.7e7 / (2 x 4.5e10) + 6 hops x 1 us)", published_s=194e-6,
        source=TPUS, where="'How to Think About TPUs', Question 5 [ICI bandwidth], answer",
        predict=_collective("2d:4x4", "permute", 2 * 8 * 128 * 8192, group=(0, 15)),
        model="tpusim routes a point-to-point flow on one dimension-order path (one port out, one in); the "
              "book splits the array over both ports of each end"),
    Case(
        name="sb-c9-allgather-v5e-8x16-sweep", kind="measured",
        title="AllGather over the wrapped 16-axis of v5e 8x16 at ~10 MB: ~95% of the link bandwidth",
        chip="v5e", slice="2d:8x16 (the 16-axis wraps)", setup="all-gather sharded 16 ways over Y, 10 MB gathered",
        published="~95% of 4.5e10 B/s per link at ~10 MB (measured sweep)", published_s=10e6 / (2 * 0.95 * 4.5e10),
        conversion="time = V / (2 x 0.95 x 4.5e10), the book's 'known cost of the collective' (V / W_ici) at "
                   "the measured 95% of the link; V = 10 MB read off the figure",
        source=SHARDING, where="'Sharded Matrices', empirical AllGather bandwidth on a TPU v5e 8x16 (figure "
                                "all-gather-bandwidth.png and the text below it)",
        predict=_collective("2d:8x16", "all_gather", 10e6, axes=("y",))),
    Case(
        name="sb-c10-reducescatter-v2-profile", kind="measured",
        title="ReduceScatter of a 134 MB bf16[8, 1024, 8192] shard over 2 TPU v2 cores: profiled",
        chip="v2", slice="2d:4x2 of v2 cores (the Colab v2-8), one hop", setup="4-way DP x 2-way MP; reduce-"
                                                                                 "scatter over the 2-way axis",
        published="1.13 ms (profile; the book predicts 1.1 ms)", published_s=1.13e-3,
        source=PROFILING, where="'How to Profile TPU Programs', 'Looking at a real(ish) example profile', the "
                                 "all-reduce-scatter fusion after the second FFW matmul",
        predict=_collective("2d:4x2", "reduce_scatter", 2 * 8 * 1024 * 8192, axes=("y",)),
        model="TPU v2 core as one device (topologies/calibration/extra_chips/v2.toml: the link bandwidth is "
              "the book's 1.2e11 bidirectional)"),
    Case(
        name="sb-v18-ffw-matmul-v2-profile", kind="measured",
        title="FFW up-projection bf16[8x1024, 8192] x bf16[8192, 16384] on one TPU v2 core: profiled",
        chip="v2", slice="one v2 core (of a 4-way DP x 2-way MP Colab v2-8)",
        setup="per core: [8, 1024, 8192] x [8192, 16384], bf16",
        published="96 ms (profile; the book predicts 95.6 ms)", published_s=96e-3,
        source=PROFILING, where="'How to Profile TPU Programs', 'Looking at a real(ish) example profile', FFW block",
        predict=_matmul(8 * 1024, 8192, 16384),
        model="per-op roofline with MXU tile padding (hardware.compute.kernel_cost); v2 peak 23e12 FLOP/s per core"),
)
