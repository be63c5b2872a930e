"""``tpusim chips``: the TPU generations tpusim knows, their key numbers and sources."""

import argparse
import dataclasses
import json
import sys

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
    from tpusim.cli.chips_table import format_chips_table, loadable_chips

    if args.json:
        chips, problems = loadable_chips()
        print(json.dumps({chip.name: dataclasses.asdict(chip) for chip in chips}, indent=2, sort_keys=True))
        for problem in problems:
            print(problem, file=sys.stderr)
    else:
        print(format_chips_table())
    return 0
