"""Pricing one DP x FSDP x TP training step from one slice to 110,592 chips, measured in one run.

    python benchmarks/bench_scale.py            # 512 .. 110,592 chips (v7, up to 3d:16x24x24 x 12 slices)
    python benchmarks/bench_scale.py --largest  # only the 110,592-chip case

The trace (built here, as a recording of such a job would hold it): 2 steps of a 4-block model with a
DeviceMesh (dp = slices, fsdp = chips per slice / 4, tp = 4): per block an FSDP all-gather of its shard,
two TP all-reduces with matmuls between, and in the backward an FSDP reduce-scatter and the DP gradient
all-reduce across slices (over DCN); a world all-reduce of the loss each step (ICI inside each slice, DCN
across: hierarchical). Ranks are slice-major (rank = slice x chips per slice + chip), the default placement.

Goal (issue 19): <= 60 s wall for the 110,592-chip step on a 2-core machine, with the cost growing
sub-linearly in chips. What keeps it flat is pricing by symmetry: a collective over a group that is a
product of torus-axis segments is simulated on one representative line, and a multislice collective's
DCN stage is counted per host block, never per chip (tpusim/network/collectives/dcn.py), so the work depends on
the number of distinct collectives, not on the chips. The simulated times are printed for reference; DCN
fidelity (per-host NICs, contention) is tpusim/network/collectives/dcn.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpusim.eager.modes import get_mode  # noqa: E402
from tpusim.pricing import price  # noqa: E402
from tpusim.slice.topology import Slice, build_slice  # noqa: E402
from tpusim.trace.records import CollectiveRecord, OpRecord, StepMarker, TensorMeta, Trace, renumber  # noqa: E402

CASES = (("3d:8x8x8", 1), ("3d:16x16x16", 1), ("3d:16x24x24", 1), ("3d:16x24x24", 4), ("3d:16x24x24", 12))
TP = 4
SHARD = 1_572_864                 # one block's fp32 parameter shard per chip (bytes)
ACTIVATIONS = 2 * 64 * 4096 * 4   # what a TP all-reduce sums (bytes)


def dp_fsdp_tp_trace(slice_: Slice, steps: int = 2, blocks: int = 4) -> Trace:
    per_slice, world = slice_.num_chips, slice_.total_chips
    tp = tuple(range(TP))
    fsdp = tuple(range(0, per_slice, TP))
    dp = tuple(range(0, world, per_slice))
    records: list = []
    tensor_id = 100

    def shard(i: int) -> TensorMeta:
        return TensorMeta(id=i, shape=(SHARD // 4,), dtype="float32", nbytes=SHARD, storage=i)

    def matmul(inputs: tuple = ()) -> OpRecord:
        return OpRecord(seq=0, op="aten::mm", unit="mxu", dtype="bfloat16", inputs=inputs,
                        flops=2 * 2048 * 4096 * 4096, matmul=(1, 2048, 4096, 4096), bytes_read=2**26)

    for step in range(steps):
        for _ in range(blocks):
            tensor_id += 1
            records.append(CollectiveRecord(seq=0, collective="all_gather", bytes=SHARD, group=fsdp, async_op=True,
                                            mesh_axis="fsdp", outputs=(shard(tensor_id),)))
            records.append(matmul((shard(tensor_id),)))
            for _ in range(2):
                records.append(matmul())
                records.append(CollectiveRecord(seq=0, collective="all_reduce", bytes=ACTIVATIONS, group=tp,
                                                mesh_axis="tp"))
        records.append(CollectiveRecord(seq=0, collective="all_reduce", bytes=4))      # the loss, whole world
        for _ in range(blocks):
            tensor_id += 1
            records.append(matmul())
            records.append(CollectiveRecord(seq=0, collective="reduce_scatter", bytes=SHARD * len(fsdp), group=fsdp,
                                            async_op=True, mesh_axis="fsdp", inputs=(shard(tensor_id),)))
            if len(dp) > 1:
                records.append(CollectiveRecord(seq=0, collective="all_reduce", bytes=SHARD, group=dp,
                                                mesh_axis="dp"))
        records.append(StepMarker(seq=0, step=step))
    return Trace(records=renumber(records), world_size=world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--largest", action="store_true", help="only the 110,592-chip case")
    args = parser.parse_args()
    print(f"{'slice':>14} {'slices':>6} {'chips':>8} {'mesh dp x fsdp x tp':>20} {'collectives':>11} "
          f"{'wall s':>7} {'wall/chip us':>12} {'step 2 (sim)':>12}")
    for topology, slices in CASES[-1:] if args.largest else CASES:
        slice_ = build_slice(topology, chip="v7", slices=slices)
        trace = dp_fsdp_tp_trace(slice_)
        began = time.perf_counter()
        timeline = price(trace, topology=slice_, mode=get_mode("strict"))
        wall = time.perf_counter() - began
        chips = slice_.total_chips
        mesh = f"{slices} x {slice_.num_chips // TP} x {TP}"
        collectives = sum(r.kind == "collective" for r in trace.records)
        print(f"{topology:>14} {slices:>6} {chips:>8,} {mesh:>20} {collectives:>11} {wall:>7.2f} "
              f"{wall / chips * 1e6:>12.1f} {timeline.steps[-1].seconds * 1e3:>10.2f}ms")


if __name__ == "__main__":
    main()
