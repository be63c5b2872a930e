"""Memory while recording a long-running script (issue 17, row 9): RSS against records, with and without
a record budget, side by side.

    python benchmarks/bench_record_memory.py [--seconds 60] [--budget 50000]

Each configuration runs in a fresh process the same loop of small ops on "tpu" (a 64x64 matmul, relu,
sum; every 100 iterations a host sync and ``tpusim.backend.step()``, a step boundary) while recording, for
``--seconds``. Printed per configuration: records, steps (and where the budget stopped the recording),
RSS at the start, at the end of the loop, after ``stop()`` (the trace built), the peak while pricing the
trace in strict mode, and after the trace is dropped; bytes of RSS per record; and RSS over the loop. The
configurations: no budget (``max_records=0``), where RSS grows with the records for as long as the script
runs, ``--budget`` records, where it must stay flat once the budget stops the recording, and ``--budget``
records with the same loop marking no step (no ``tpusim.backend.step()``: only the recorder's watcher thread
drains the shim's log), where it must stay flat too once the budget stops the recording at exactly the budget.

Measured (2026-11-24, 2 cores shared with other jobs, so records/s varies 2-5x between runs). Before the
budget (the previous version of this script, records built in the shim, 30 s): 35,481 records, 288
B/record in the native log, 840 B/record as a trace. With it, two runs of 60 s: no budget 479,035 /
102,152 records, RSS +363 / +81 MiB at the loop's end (795 / 834 B/record), pricing peak 1,207 / 1,246
B/record, still growing at the end (+305 MiB at 50 s in the first run); budget 50,000: 50,522 records both
times, stopped after step 57 (of 231 / 115), RSS flat from then on at +40 / +38 MiB, pricing peak +60 /
+58 MiB. So a recording costs about 0.8 KiB a record and pricing strict about 0.4 KiB more; pricing all
three modes of a 60,444-record trace of this loop, timelines kept as `tpusim run --mode all` keeps them,
peaked at 2,795 B/record (strict 1,220, + fused 1,653, + debug 2,795). The default budget (tpusim/envvars.py
MAX_RECORDS_DEFAULT, 600,000 records) therefore holds a long run near 0.7 GB (one mode) to 1.7 GB (every
mode) above the interpreter's 0.24 GB, however long the script runs. The loop marking no steps (30 s, next
to no budget: 544,411 records, +424 MiB and growing, and budget 50,000: +41 MiB flat after step 57): stopped
at exactly 50,000 records, RSS flat at +69 MiB from 5 s on (the watcher drains a quarter second of records
at a time, so its peak holds a little more than the budget), pricing peak +73 MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import gc, json, os, resource, sys, time
import torch, tpusim.backend as tb
from tpusim.eager.modes import get_mode
from tpusim.pricing import price
from tpusim.slice.topology import build_slice

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

seconds, budget, mark_steps = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "steps"
x = torch.randn(64, 64, device="tpu")
w = torch.randn(64, 64, device="tpu")
start = rss()
began = time.time()
samples = []
rec = tb.start(max_records=budget)
i = 0
next_sample = began
while time.time() - began < seconds:
    y = (x @ w).relu().sum()
    if i % 100 == 0:
        y.item()
        if mark_steps:
            tb.step()                  # a step boundary: where a record budget can stop the recording
        if time.time() >= next_sample:
            samples.append([round(time.time() - began), rss()])
            next_sample += seconds / 6
    i += 1
loop_end = rss()
trace = tb.stop()
records = len(trace.records)
stopped = rss()
before_price = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
price(trace, topology=build_slice("3d:1x1x1"), mode=get_mode("strict"))
priced_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
steps, stopped_after_step = rec.steps, rec.stopped_after_step
del trace, rec
gc.collect()
print("RESULT " + json.dumps({"records": records, "start": start, "loop_end": loop_end, "stopped": stopped,
                              "priced_peak": max(priced_peak, before_price), "dropped": rss(), "samples": samples,
                              "steps": steps, "stopped_after_step": stopped_after_step}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--budget", type=int, default=50_000,
                        help="the record budget of the second configuration (the first has none)")
    args = parser.parse_args()
    mib = 2 ** 20
    for name, budget, steps in (("no budget", 0, "steps"), (f"budget {args.budget:,} records", args.budget, "steps"),
                                (f"budget {args.budget:,} records, no steps", args.budget, "none")):
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.seconds), str(budget), steps],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.split("RESULT ", 1)[1])
        n = max(r["records"], 1)
        growth = [(t, round((m - r["start"]) / mib)) for t, m in r["samples"]]
        stop = (f"; {r['steps']:,} steps" if r["stopped_after_step"] is None
                else f"; stopped after step {r['stopped_after_step']:,} of {r['steps']:,}" if r["stopped_after_step"]
                else "; stopped before any step")
        print(f"{name}: {r['records']:,} records in {args.seconds:.0f} s{stop}; RSS start {r['start'] / mib:.0f} MiB, "
              f"loop end {r['loop_end'] / mib:.0f} MiB ({(r['loop_end'] - r['start']) / n:.0f} B/record), "
              f"after stop {r['stopped'] / mib:.0f} MiB ({(r['stopped'] - r['start']) / n:.0f} B/record as a "
              f"trace), peak while pricing strict {r['priced_peak'] / mib:.0f} MiB "
              f"({(r['priced_peak'] - r['start']) / n:.0f} B/record), after the drop {r['dropped'] / mib:.0f} MiB")
        print(f"  RSS growth over the loop (s, MiB): {growth}")


if __name__ == "__main__":
    main()
