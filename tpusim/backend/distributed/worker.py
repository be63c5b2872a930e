"""One rank's process under ``--ranks all``: run the script as __main__, record, report how it ended.

    python -m tpusim.backend.distributed.worker --trace out/rank1.jsonl SCRIPT [ARGS...]

The trace is written with every record's ``rank`` set, for the launcher to merge. How the script
ended goes to the control store (``status/<rank>``) so waiting peers stop at once: ``exited``,
``crashed`` (exception type, message, the script's line), or ``failed`` (a collective diagnosis).
A script that ended normally with isend/irecv never waited for (and no destroy_process_group()) has them
finished first (``finish_messages``): they move, or the one whose peer never posts is diagnosed, exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys

import torch  # noqa: F401  (before tpusim.backend: the device registers at `import torch`)

from tpusim.backend.distributed import budget, p2p, process_group
from tpusim.backend.distributed.hang import CollectiveMismatchError
from tpusim.backend.program_trace.recorder import recording
from tpusim.script import ScriptOutcome, run_script
from tpusim.trace.records import Trace, write_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpusim-rank")
    parser.add_argument("--trace", required=True)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # the control store's secret, from the launcher: kept out of the environment the script and its children see
    process_group.CONTROL_SECRET = os.environ.pop("TPUSIM_CONTROL_TOKEN", "")
    with recording() as rec:
        outcome = run_script(args.script, list(args.args))
    outcome = finish_messages(outcome)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the script has ended: what it recorded is written whole
    trace = rec.trace
    records = tuple(dataclasses.replace(r, rank=rank) for r in trace.records)
    write_trace(Trace(records=records, world_size=world, rank=rank, meta=trace.meta), args.trace)
    budget.stop_path(args.trace).unlink(missing_ok=True)     # none from an earlier run into the same folder
    if rec.stopped_after_step is not None:                   # the record budget stopped this rank: for the merge
        budget.write_stop(args.trace, rank, rec.stopped_after_step, rec.steps, len(records), rec.max_records)
    control = process_group.CONTROL
    if outcome.error_type == "CollectiveMismatchError":
        if os.environ.get("TPUSIM_LAUNCHED"):
            print(f"tpusim: rank {rank} stopped (collective diagnosis below)", file=sys.stderr)
        else:
            print(outcome.error, file=sys.stderr, end="")
    elif outcome.error_type == "KeyboardInterrupt":
        print(f"tpusim: rank {rank} stopped by Ctrl-C", file=sys.stderr)
        if control is not None:
            control.set_status("crashed", "stopped by Ctrl-C")
    elif outcome.error:
        print(outcome.error, file=sys.stderr, end="")
        if control is not None:
            control.set_status("crashed", crash_summary(outcome.error))
    elif control is not None:
        control.set_status("exited")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(outcome.exit_code)  # skip interpreter teardown: gloo threads may still wait on dead peers


def finish_messages(outcome: ScriptOutcome) -> ScriptOutcome:
    """After a script that succeeded, wait for its open isend/irecv messages (as destroy_process_group()
    does), so none is dropped silently; the outcome becomes the diagnosis of one whose peer never posts.
    The waits are hang detection's (the peer's exit, a wait cycle, TPUSIM_HANG_TIMEOUT_S): never a hang."""
    if outcome.exit_code != 0 or outcome.error is not None or process_group.CONTROL is None:
        return outcome
    try:
        p2p.drain()
    except CollectiveMismatchError as e:
        return ScriptOutcome(exit_code=1, error=f"{e}\n", error_type="CollectiveMismatchError")
    except KeyboardInterrupt:
        return ScriptOutcome(exit_code=130, error="KeyboardInterrupt\n", error_type="KeyboardInterrupt")
    except Exception as e:  # noqa: BLE001 (said as this rank's error, never a raw traceback)
        return ScriptOutcome(exit_code=1, error=f"tpusim: rank {process_group.CONTROL.rank} could not finish its "
                             f"open isend/irecv messages at exit: {type(e).__name__}: {e}\n",
                             error_type=type(e).__name__)
    return outcome


def crash_summary(traceback_text: str) -> str:
    """'ZeroDivisionError: division by zero at crash.py:9' from a formatted user traceback."""
    lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
    where = ""
    for ln in lines:
        text = ln.strip()
        if text.startswith('File "'):
            path, _, rest = text[6:].partition('", line ')
            if "site-packages" in path or "/torch/" in path:
                continue
            where = f"{os.path.basename(path)}:{rest.split(',')[0]}"
    last = lines[-1] if lines else "unknown error"
    return f"{last} at {where}" if where else last


if __name__ == "__main__":
    sys.exit(main())
