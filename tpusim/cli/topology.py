"""``tpusim topology SPEC``: what a TPU slice of that shape is (chips, links, wrap, bisection)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tpusim.errors import TpusimError

EXAMPLES = """\
SPEC is DIMS:SHAPE: 1d:N, 2d:AxB or 3d:AxBxC (axes x, y, z in that order).
The chip defaults by dimensionality (3d -> v5p, 2d -> v6e); the summary says which was used.

examples:
  python -m tpusim topology 3d:8x8x8                  # 512-chip v5p slice, wrapped on every axis
  python -m tpusim topology 3d:2x2x2                  # below a full 4x4x4 cube: no wraparound
  python -m tpusim topology 2d:8x16 --chip v6e        # only the axis of 16 wraps on v5e/v6e
  python -m tpusim topology 3d:4x4x8 --twisted        # twisted torus (v4/v5p, k x k x 2k)
  python -m tpusim topology 2d:16x16 --slices 4       # four pods joined over DCN (multislice)
  python -m tpusim topology 3d:4x4x4 --no-wrap --json # machine-readable, wrap links removed
  python -m tpusim topology 3d:4x4x4 --png cube.png   # draw the lattice, wrap links dashed
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "topology", help="describe a TPU slice: chips, ICI links, wraparound, diameter, bisection",
        description="Build a TPU slice from a topology string and describe it.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="SPEC", help="slice shape, e.g. 3d:8x8x8, 2d:16x16, 1d:8")
    parser.add_argument("--chip", help="chip generation (see `tpusim chips`), e.g. v5p, v6e")
    parser.add_argument("--slices", default="1", metavar="N",
                        help="number of identical slices joined over DCN (multislice; 1 to 1024, default 1)")
    wrap = parser.add_mutually_exclusive_group()
    wrap.add_argument("--wrap", metavar="AXES",
                      help="force wraparound on exactly these axes, e.g. --wrap x,y (others open)")
    wrap.add_argument("--no-wrap", action="store_true", help="no wraparound on any axis (a mesh)")
    parser.add_argument("--twisted", action="store_true",
                        help="twisted torus (v4/v5p shapes k x k x 2k and k x 2k x 2k)")
    parser.add_argument("--json", action="store_true", help="print a machine-readable JSON object")
    parser.add_argument("--png", metavar="FILE", help="draw the slice to a PNG file")
    parser.set_defaults(run=run)


def wrap_override(dims: tuple[int, ...], axes: str | None, no_wrap: bool) -> tuple[bool, ...] | None:
    """--wrap x,y / --no-wrap -> a per-axis wrap tuple (None: the chip's rule decides)."""
    from tpusim.errors import plain_text, shown
    from tpusim.slice.topology import AXIS_NAMES

    if no_wrap:
        return (False,) * len(dims)
    if axes is None:
        return None
    names = AXIS_NAMES[:len(dims)]
    plain_text(axes, "--wrap", f"accepted: axis letters {', '.join(names)} separated by commas", max_length=64)
    chosen = {a.strip(" ") for a in axes.split(",") if a.strip(" ")}
    unknown = chosen - set(names)
    if unknown:
        raise TpusimError(f"--wrap names axis {', '.join(map(shown, sorted(unknown)))} that a {len(dims)}d slice "
                          f"lacks; accepted: {', '.join(names)}")
    return tuple(name in chosen for name in names)


def check_image_path(text: str, flag: str = "--png") -> Path:
    """Where a figure goes: printable text, in a folder that exists and takes files, with a suffix
    matplotlib writes (png, svg, pdf, ...); checked before anything is drawn."""
    from tpusim.errors import plain_text, shown

    path = Path(plain_text(text, flag, "give a file name such as slice.png", max_length=4096, ascii_only=False))
    folder = path.parent
    if not folder.is_dir():
        raise TpusimError(f"{flag} {shown(text)}: the folder {str(folder)!r} does not exist; create it first "
                          f"or give another path")
    if path.is_dir():
        raise TpusimError(f"{flag} {shown(text)} is a folder; give a file name such as {path / 'slice.png'}")
    if not os.access(folder, os.W_OK):
        raise TpusimError(f"{flag} {shown(text)}: the folder {str(folder)!r} is not writable")
    return path


def draw_to(slice_, path: Path, flag: str = "--png") -> None:
    """Draw ``slice_`` to ``path`` atomically (a unique temporary name, then one rename)."""
    from tpusim.errors import shown
    from tpusim.output import temporary_name
    from tpusim.slice.plot import draw_slice

    tmp = temporary_name(path).with_suffix(path.suffix or ".png")
    try:
        draw_slice(slice_, tmp)
        os.replace(tmp, path)
    except (OSError, ValueError) as error:      # ValueError: a suffix matplotlib has no writer for
        raise TpusimError(f"{flag} {shown(str(path))}: cannot write the drawing: "
                          f"{getattr(error, 'strerror', None) or error}") from None
    finally:
        tmp.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from tpusim.slice.topology import build_slice, parse_slices, parse_topology
    from tpusim.units import format_rate

    slices = parse_slices(args.slices)
    dims = parse_topology(args.spec)
    png = check_image_path(args.png) if args.png else None
    slice_ = build_slice(args.spec, chip=args.chip, wrap=wrap_override(dims, args.wrap, args.no_wrap),
                         slices=slices, twisted=args.twisted or None)
    info = slice_.to_dict()
    if png is not None:
        draw_to(slice_, png)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    chip = slice_.chip
    axes = ", ".join(f"{name}={n}{' (wraps)' if w else ''}"
                     for name, n, w in zip(slice_.axis_names, slice_.dims, slice_.wrap))
    default_note = " (default for this dimensionality; choose with --chip)" \
        if info["default_chip_used"] else ""
    lines = [
        f"slice {args.spec} on {chip.display_name}{default_note}",
        f"  chips            {slice_.num_chips}" + (f" per slice x {slice_.num_slices} slices = "
                                                    f"{slice_.total_chips}" if slice_.num_slices > 1 else ""),
        f"  hosts            {info['hosts']} ({chip.chips_per_host} chips per host)",
        f"  axes             {axes}" + ("  [twisted]" if slice_.twisted else ""),
        f"  ICI links        {info['links']} (each {format_rate(chip.ici_link_bytes_per_s)} one way, "
        f"{chip.ici_hop_latency_ns / 1000:g} us per hop)",
        f"  diameter         {info['diameter_hops']} hops",
        f"  bisection        {format_rate(info['bisection_bytes_per_s'])} "
        f"(links cut by halving the longest axis x one-way link bandwidth)",
    ]
    if slice_.num_slices > 1:
        lines.append(f"  DCN              {format_rate(chip.dcn_bytes_per_s)} per chip between slices")
    if slice_.shape_note:
        lines.append(f"  warning          {slice_.shape_note}")
    if not all(slice_.wrap):
        lines.append("  note             an axis without wraparound is a line, not a ring: collectives on "
                     "it take about 2x as long")
    if args.png:
        lines.append(f"  drawing          {args.png}")
    print("\n".join(lines))
    return 0
