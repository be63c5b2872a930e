"""Memory while recording a long-running script (issue 17, row 9): RSS against records, side by side.

    python benchmarks/bench_record_memory.py [--seconds 60]

Each configuration runs in a fresh process the same loop of small ops on "tpu" (a 64x64 matmul, relu,
sum; a host sync every 100 iterations) while recording, for ``--seconds``. Printed per configuration:
records, RSS at the start, at the end of the loop (the device's native log holds the records), after
``stop()`` (the trace built as Python records), and after the trace is dropped; bytes of RSS per record;
and what stays after the drop (memory the allocator keeps: fragmentation). Configurations: glibc's
default malloc, and a fixed mmap threshold (GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072, which
stops glibc raising the threshold after large frees, the usual cause of a heap that never shrinks).
Memory per record is linear in the records by design (the trace is the program); what must not grow is
the per-record figure over time and what stays after the drop.

Measured (2026-11-24, 2 cores shared with other jobs, so records/s varies 2-3x between runs), two runs
of 60 s per configuration: glibc default 112,606 / 113,507 records, 227 / 638 B/record in the native
log, 852 / 1,275 B/record as a trace, 21 / 68 MiB kept after the drop; fixed mmap threshold 103,533 /
292,915 records, 478 / 219 and 1,092 / 833 B/record, 42 / 35 MiB kept. Neither configuration is
consistently better, so tpusim sets no tunable: RSS grows with the records (about 0.2 KiB each while
recording, about 1 KiB once the trace is built), and a 10-minute loop at 50,000 records/s would need
about 30 GB as a trace: that is the recording's size, not a leak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, os, sys, time
import torch, tpusim.backend as tb

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

seconds = float(sys.argv[1])
x = torch.randn(64, 64, device="tpu")
w = torch.randn(64, 64, device="tpu")
start = rss()
began = time.time()
samples = []
rec = tb.start()
i = 0
next_sample = began
while time.time() - began < seconds:
    y = (x @ w).relu().sum()
    if i % 100 == 0:
        y.item()
        if time.time() >= next_sample:
            samples.append([round(time.time() - began), rss()])
            next_sample += seconds / 6
    i += 1
loop_end = rss()
trace = tb.stop()
records = len(trace.records)
stopped = rss()
del trace, rec
gc.collect()
print("RESULT " + json.dumps({"records": records, "start": start, "loop_end": loop_end, "stopped": stopped,
                              "dropped": rss(), "samples": samples}))
"""

CONFIGS = {"glibc default": {}, "fixed mmap threshold": {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    mib = 2 ** 20
    for name, env in CONFIGS.items():
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.seconds)], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout
        r = json.loads(out.split("RESULT ", 1)[1])
        n = max(r["records"], 1)
        growth = [(t, round((m - r["start"]) / mib)) for t, m in r["samples"]]
        print(f"{name}: {r['records']:,} records in {args.seconds:.0f} s; RSS start {r['start'] / mib:.0f} MiB, "
              f"loop end {r['loop_end'] / mib:.0f} MiB ({(r['loop_end'] - r['start']) / n:.0f} B/record in the "
              f"native log), after stop {r['stopped'] / mib:.0f} MiB ({(r['stopped'] - r['start']) / n:.0f} "
              f"B/record as a trace), after the drop {r['dropped'] / mib:.0f} MiB "
              f"({(r['dropped'] - r['start']) / mib:.0f} MiB kept)")
        print(f"  RSS growth over the loop (s, MiB): {growth}")


if __name__ == "__main__":
    main()
