"""``tpusim run SCRIPT``: the command line of the run pipeline (tpusim/run/pipeline.py).

This module only parses flags into ``RunOptions``; what a run does lives in ``tpusim.run.pipeline``.
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING

from tpusim import envvars
from tpusim.errors import TpusimError

if TYPE_CHECKING:
    pass

EXAMPLES = """\
The script runs unchanged as __main__ with its own arguments (after --); its tensors on
device "tpu" live on the simulated chip. Steps are counted at optimizer.step() or at an
explicit tpusim.backend.step().

examples:
  python -m tpusim run examples/mlp.py                          # one v5p chip, strict mode
  python -m tpusim run examples/transformer.py --topology 3d:8x8x8 --mode all
  python -m tpusim run examples/transformer.py --numerics off -- --layers 24 --d-model 2048
  python -m tpusim run examples/mlp.py --numerics tpu           # the values a TPU computes (bf16 MXU passes)
  python -m tpusim run examples/dlrm.py --chip v5e --topology 2d:4x4 --out reports/dlrm-v5e
  python -m tpusim run examples/mlp.py --target pjrt --mode all # also run each mode for real through JAX
  python -m tpusim run examples/mlp.py --chip v5e --fit-batch batch -- --batch 64   # the largest that fits

--target pjrt: after pricing, each mode runs the script for real
on JAX's default device (a TPU where JAX sees one, else its CPU or GPU), in a fresh process with
TPUSIM_TARGET=pjrt and nothing recorded; the report's `measured` section and the summary set its
wall time per step beside the prediction. On a TPU the prediction is for that chip (unless --chip);
elsewhere compare the ratios between modes, not the absolute times.

What it writes (in --out, default reports/<script>-<topology>-<time>/):
  report.json   the versioned cost report (its fields: docs/report.md)
  report.html   one self-contained page with the figures; *.png the figures alone
  trace.json    Chrome/Perfetto trace of the fastest mode (open in ui.perfetto.dev)
  program.jsonl the recorded program trace, to re-price without re-running
  .tpusim-run.json  the files this run wrote: a rerun into --out replaces only those
"""


NUMERICS_HELP = """\
how values are computed (default on):
on: as CPU computes them, bit for bit
off: not at all: shape-only, no tensor memory
tpu: as a TPU does: f32 matmul/conv/attention in bf16"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of a flag's help that has them (--numerics: one line per value), wraps the rest."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        wrap = super()._split_lines
        return [line for part in text.splitlines() for line in wrap(part, width)]


def add_parser(subparsers) -> None:
    from tpusim.eager.modes import DEFAULT_MODE, MODES
    from tpusim.hardware.calibration import add_calibration_argument
    from tpusim.run.options import NUMERICS, add_fit_batch_argument, add_slices_argument
    from tpusim.slice.faults import add_fault_arguments
    from tpusim.xla.programs import COMPILERS

    parser = subparsers.add_parser(
        "run", help="run a PyTorch script on a simulated TPU slice and report what it would cost",
        description="Run SCRIPT with its tensors on the simulated 'tpu' device and write a cost report.",
        epilog=EXAMPLES, formatter_class=_Formatter)
    parser.add_argument("script", metavar="SCRIPT", help="the Python file to run, e.g. examples/mlp.py")
    parser.add_argument("--topology", metavar="SPEC",
                        help="slice shape, e.g. 3d:8x8x8 or 2d:16x16 (default: a single chip)")
    parser.add_argument("--chip", help="chip generation, e.g. v5p, v6e (default: by topology; v5p alone)")
    add_slices_argument(parser)
    parser.add_argument("--mode", default=None,
                        help=f"eager mode(s) to price: {', '.join(MODES)}, a comma list, or all (default: the "
                             f"mode the environment selects for the script, TPUSIM_EAGER_MODE or TorchTPU's "
                             f"TORCH_TPU_DEFER_AND_FUSE / TORCH_TPU_LAUNCH_BLOCKING, else {DEFAULT_MODE}); one "
                             f"recording is priced per mode")
    parser.add_argument("--numerics", choices=NUMERICS, default="on", help=NUMERICS_HELP)
    parser.add_argument("--out", metavar="DIR", help="report folder (default reports/<script>-<topology>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines, only the final summary")
    parser.add_argument("--ranks", choices=("auto", "one", "all"), default="auto",
                        help="one: this process is rank 0 of the whole world (collectives by the symmetry "
                             "rule); all: one process per chip, data really moves, hangs are diagnosed "
                             "(auto: all for 2..16 chips when the script uses torch.distributed, else one)")
    parser.add_argument("--placement", metavar="MAP",
                        help="DeviceMesh dims -> torus axes, e.g. 'tp=x,fsdp=yz' (default: innermost dim on x, "
                             "then y, z)")
    add_calibration_argument(parser)
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="who builds the programs tpusim prices (torch.compile graphs, Fused eager clusters, "
                             "eager ops): xla (the real TPU compiler, deviceless; needs pip install -e \".[xla]\"), "
                             "model (tpusim's own fusion model) or auto (default: the path `tpusim validate` "
                             "found closer to published runs, xla only where the extra is installed and its "
                             "validated band is no worse). The first lines say which path priced the table")
    parser.add_argument("--compare-placements", action="store_true",
                        help="also price every distinct placement of the DeviceMesh, ranked by step time")
    parser.add_argument("--target", choices=("sim", "pjrt"), default="sim",
                        help="sim: the prediction only (default); pjrt: also run the script for real through "
                             "JAX, one fresh process per mode, and report measured step times beside the "
                             "prediction (priced on JAX's TPU chip unless --chip)")
    parser.add_argument("--pjrt-timeout", type=float, default=3600.0, metavar="S",
                        help="--target pjrt: stop a measured run after S seconds (default 3600; 0: never)")
    parser.add_argument("--tokens-per-step", type=_tokens_per_step, metavar="N",
                        help="tokens one step processes over the whole slice (global batch x sequence length): "
                             "the report then gives tokens/s per chip and per slice")
    parser.add_argument("--max-records", type=_max_records, metavar="N",
                        help="record budget: once a step ends with N records recorded, recording stops (the "
                             "script runs on; the report prices the steps recorded and says so); before any "
                             "step, it stops at exactly N records (the report prices that prefix); per rank "
                             "with --ranks all; default TPUSIM_MAX_RECORDS or 6e5 (under 2 GB), 0: no limit")
    add_fault_arguments(parser)
    add_fit_batch_argument(parser)
    parser.set_defaults(run=run, script_args=[])


def _max_records(text: str) -> int:
    """--max-records: read as TPUSIM_MAX_RECORDS is (tpusim/envvars.py), else argparse's clear error."""
    try:
        return int(envvars.BY_NAME["TPUSIM_MAX_RECORDS"].parse(text))
    except (ValueError, OverflowError, TpusimError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of records >= 0, e.g. 2e6 "
                                         f"(0: no limit)") from None


def _tokens_per_step(text: str) -> int:
    """--tokens-per-step: a positive whole number, else argparse's clear error."""
    if not (text.isascii() and text.strip().isdigit()) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of tokens, e.g. 8192 "
                                         f"(global batch 8 x sequence 1024)")
    return int(text)


def run(args: argparse.Namespace) -> int:
    from tpusim.run.options import RunOptions
    from tpusim.run.pipeline import run_pipeline
    from tpusim.script import wait_for_script_threads

    before = set(threading.enumerate())
    return wait_for_script_threads(before, run_pipeline(RunOptions.from_args(args)).exit_code)
