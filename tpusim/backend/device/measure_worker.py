"""The measuring side of ``tpusim run --target pjrt``: run a script for real on the PJRT target, time its steps.

tpusim/run/measure.py starts it, once per eager mode, in a fresh process::

    TPUSIM_TARGET=pjrt TPUSIM_EAGER_MODE=fused python -m tpusim.backend.device.measure_worker \\
        --out RESULT.json -- SCRIPT ARGS...

Importing the backend has then already switched the device to JAX (its config names the pjrt
target). Nothing is recorded: recording adds host work to every op and would distort the clock. A
step ends at ``optimizer.step()`` (the hook the recorder uses too) or an explicit
``tpusim.backend.step()`` (a recorder step listener), after pending fused work has run
(``pjrt.flush``), so the clock never stops before the device work of the step is done. The
script runs as ``__main__`` with its own argv (tpusim/script.py); its failure is printed as its own
traceback and written to RESULT.json with the steps timed before it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch  # noqa: F401  (first: the backend registers its device on torch)
from torch.optim.optimizer import register_optimizer_step_post_hook

from tpusim.backend.distributed import runner
from tpusim.backend.program_trace import recorder
from tpusim.backend.targets import pjrt
from tpusim.script import ScriptOutcome, run_script, user_traceback


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else 'measure_worker'}",
                                     description="Time a script's steps on the PJRT target (tpusim run "
                                                 "--target pjrt starts this; it is not meant to be run by hand).")
    parser.add_argument("--out", required=True, help="where to write the measurements (JSON)")
    parser.add_argument("--world", type=int, default=1, help="world size the script sees (rank 0 of it)")
    parser.add_argument("--chips-per-host", type=int, default=1)
    args = parser.parse_args(argv[:split])
    script = argv[split + 1:]
    if not script:
        parser.error("give the script after --")
    return args, script


def main(argv: list[str] | None = None) -> int:
    args, (script, *script_argv) = _parse(sys.argv[1:] if argv is None else argv)
    if pjrt.mode() is None:
        print("tpusim: the PJRT target is off (TPUSIM_TARGET=pjrt was not seen at import)", file=sys.stderr)
        return 2
    if args.world > 1:
        runner.prepare_one(args.world, args.chips_per_host)
    marks: list[float] = []

    def mark() -> None:
        pjrt.flush("step")                  # pending fused work belongs to this step
        marks.append(time.perf_counter())

    recorder.add_step_listener(mark)        # tpusim.backend.step()
    hook = register_optimizer_step_post_hook(lambda optimizer, a, kw: mark())
    target_mode = pjrt.mode()               # the mode it starts in (a script may switch later)
    started = time.perf_counter()
    outcome = run_script(script, script_argv)
    try:
        pjrt.flush("end")                   # work still pending when the script ended
    except Exception as error:              # a deferred error of the script's own ops
        if outcome.error is None:
            outcome = ScriptOutcome(1, user_traceback(error), type(error).__name__)
    ended = time.perf_counter()
    hook.remove()
    recorder.remove_step_listener(mark)
    if outcome.error:
        print(outcome.error, file=sys.stderr, end="")
    result = {"steps_s": [b - a for a, b in zip([started, *marks], marks)], "total_s": ended - started,
              "exit_code": outcome.exit_code, "error_type": outcome.error_type, "error": outcome.error,
              "target_mode": target_mode}
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not lose what was measured
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return outcome.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
