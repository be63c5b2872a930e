"""``tpusim chips``: the TPU generations tpusim knows, their key numbers and sources."""

import argparse
import dataclasses
import json

EXAMPLES = """\
examples:
  python -m tpusim chips            # table of v4, v5e, v5p, v6e, v7 and the sources of the numbers
  python -m tpusim chips --json     # every ChipSpec field, machine-readable
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "chips", help="list TPU generations with key numbers and their public sources",
        description="List the chip generations under topologies/chips/ (one TOML file each).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print every field of every chip as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tpusim.cli.chips_table import format_chips_table
    from tpusim.hardware.spec import available_chips, load_chip

    if args.json:
        chips = {name: dataclasses.asdict(load_chip(name)) for name in available_chips()}
        print(json.dumps(chips, indent=2, sort_keys=True))
    else:
        print(format_chips_table())
    return 0
