"""``tpusim collective KIND --bytes SIZE --topology SPEC``: price one collective on a simulated slice."""

from __future__ import annotations

import argparse
import json

from tpusim.errors import TpusimError

EXAMPLES = """\
KIND is one of: all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, reduce, permute.
SIZE is V in the scaling book's sense: all_gather = output bytes per chip, reduce_scatter =
input bytes per chip, all_reduce / broadcast / reduce = the buffer, all_to_all = the per-chip
buffer, permute = what each chip sends. Units: 4096, 34MB (10^6), 1GiB (2^30).

Two times are printed: the discrete-event simulation (DES: chunks queueing on one-way ICI
channels) and the closed-form alpha-beta formula; alone on the network they agree.

examples:
  python -m tpusim collective all_reduce --bytes 1GiB --topology 3d:4x4x4
  python -m tpusim collective all_gather --bytes 64MiB --topology 3d:8x8x8 --axes x
  python -m tpusim collective all_reduce --bytes 4KiB --topology 3d:4x4x4 --json
  python -m tpusim collective all_reduce --bytes 1GiB --topology 3d:4x4x4 --algorithm bidi_ring --axes x
  python -m tpusim collective all_to_all --bytes 32MiB --topology 2d:16x16 --chip v5e
  python -m tpusim collective all_reduce --bytes 1GiB --topology 2d:16x16 --chip v6e --slices 4
  python -m tpusim collective all_gather --bytes 16MiB --topology 3d:4x4x4 --no-wrap
"""


def add_parser(subparsers) -> None:
    from tpusim.hardware.calibration import add_calibration_argument
    from tpusim.network.collectives import ALGORITHMS, KINDS
    from tpusim.slice.faults import add_fault_arguments

    parser = subparsers.add_parser(
        "collective", help="price one collective (all_reduce, all_gather, ...) on a slice: DES and closed form",
        description="Simulate one collective alone on a TPU slice's ICI (and DCN) and compare the "
                    "discrete-event time with the closed-form formula.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", metavar="KIND", help=f"collective: {', '.join(KINDS)}")
    parser.add_argument("--bytes", required=True, metavar="SIZE", dest="size",
                        help="bytes per chip as described above, e.g. 4096, 34MB, 1GiB")
    parser.add_argument("--topology", required=True, metavar="SPEC", help="slice shape, e.g. 3d:8x8x8, 2d:16x16")
    parser.add_argument("--chip", help="chip generation (see `tpusim chips`); default by dimensionality")
    parser.add_argument("--axes", metavar="AXES",
                        help="torus axes the collective runs over, e.g. x or x,y (and dcn with --slices); "
                             "default: all of them")
    parser.add_argument("--algorithm", metavar="NAME",
                        help=f"force an algorithm: {', '.join(ALGORITHMS)} (default: cheapest closed form)")
    parser.add_argument("--chunk", metavar="SIZE",
                        help="DES chunk size (how finely flows interleave on a link; default 4MiB)")
    parser.add_argument("--slices", default="1", metavar="N",
                        help="identical slices joined over DCN (multislice; 1 to 1024, default 1)")
    wrap = parser.add_mutually_exclusive_group()
    wrap.add_argument("--wrap", metavar="AXES", help="force wraparound on exactly these axes, e.g. --wrap x,y")
    wrap.add_argument("--no-wrap", action="store_true", help="no wraparound on any axis (a mesh)")
    parser.add_argument("--twisted", action="store_true", help="twisted torus (v4/v5p k x k x 2k shapes)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON object")
    add_fault_arguments(parser)
    add_calibration_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.cli.topology import wrap_override
    from tpusim.errors import plain_text, shown
    from tpusim.hardware.calibration import calibration_label
    from tpusim.network.collectives import ALGORITHMS, KINDS, simulate_collective
    from tpusim.slice.faults import apply_faults, fault_args
    from tpusim.slice.topology import build_slice, parse_slices, parse_topology
    from tpusim.units import parse_bytes

    if args.kind not in KINDS:
        raise TpusimError(f"unknown collective {shown(args.kind)}: accepted {', '.join(KINDS)}")
    slices = parse_slices(args.slices)
    if args.axes is not None:
        plain_text(args.axes, "--axes", "accepted: axis letters x, y, z (and dcn) separated by commas", max_length=64)
    if args.algorithm is not None:
        plain_text(args.algorithm, "--algorithm", f"accepted: {', '.join(ALGORITHMS)}", max_length=64)
    nbytes = parse_bytes(args.size)
    chunk = parse_bytes(args.chunk) if args.chunk else None
    dims = parse_topology(args.topology)
    slice_ = build_slice(args.topology, chip=args.chip, wrap=wrap_override(dims, args.wrap, args.no_wrap),
                         slices=slices, twisted=args.twisted or None, calibrated=not args.no_calibration)
    slice_ = apply_faults(slice_, *fault_args(args))
    result = simulate_collective(slice_, args.kind, nbytes, axes=args.axes, algorithm=args.algorithm,
                                 chunk_bytes=chunk)
    if args.json:
        out = result.to_dict()
        out.update(chip=slice_.chip.name, calibration=calibration_label(slice_.chip), topology=slice_.spec,
                   slices=slice_.num_slices)
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(_table(result, slice_))
    return 0


def _table(r, slice_) -> str:
    from tpusim.hardware.calibration import calibration_text
    from tpusim.units import format_bytes, format_rate, format_seconds

    chip = slice_.chip
    where = slice_.label
    axes = ",".join(r.axes) or "-"
    link = chip.ici_link_bytes_per_s
    diff = r.time_s - r.closed_form_s
    rel = diff / r.closed_form_s if r.closed_form_s > 0 else 0.0
    if abs(rel) < 0.01:
        verdict = "agrees with the DES on this idle network"
    elif rel > 0:
        verdict = f"DES {rel:+.1%}: links shared unevenly, which the formula does not see"
    else:
        verdict = f"DES {rel:+.1%}: flows overlap latency with queueing, which the formula adds up"
    rows = [
        ("algorithm", r.algorithm, r.reason),
        ("time (DES)", format_seconds(r.time_s), "discrete-event simulation: chunks queueing on one-way links"),
        ("closed form", format_seconds(r.closed_form_s),
         f"alpha-beta formula, no contention ({verdict})"),
        ("algbw", format_rate(r.algbw_bytes_per_s), "bytes / DES time"),
        ("bus bandwidth", format_rate(r.busbw_bytes_per_s),
         f"algbw x NCCL bus factor; one ICI link is {format_rate(link)} one way, {format_rate(2 * link)} both"),
        ("busiest link", f"{r.max_link_utilisation:.0%}", "share of the collective's time its busiest one-way link "
                                                         "was moving its bytes"),
        ("link traffic", format_bytes(r.link_bytes), "bytes x hops summed over all links of the group"),
        ("simulated", "", r.simulated or "every transfer"),
    ]
    head = (f"{r.kind} of {format_bytes(r.bytes)} over {r.group_size} chips (axes {axes}) "
            f"on {where}, {chip.display_name} ({calibration_text(chip)})")
    width = max(len(v) for _, v, _ in rows)
    lines = [head] + [f"  {k:<14} {v:<{width}}  {why}" for k, v, why in rows]
    return "\n".join(lines)
