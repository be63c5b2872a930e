"""``python -m tpusim``: one dispatcher, one module per subcommand under tpusim/cli/.

Adding a subcommand = one module with ``add_parser(subparsers)`` and ``run(args) -> int``,
listed in ``COMMANDS``. Bad input (``TpusimError``) is printed as one line with exit code 2; Ctrl-C that
reaches here (no report to save: `tpusim run` handles its own once the script has run) is one line and 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tpusim import __version__
from tpusim.errors import TpusimError

# subcommand name -> module under tpusim.cli (imported lazily: `run` pulls in torch)
COMMANDS = {
    "chips": "chips",
    "topology": "topology",
    "collective": "collective",
    "run": "run",
    "compare": "compare",
    "validate": "validate",
    "check": "check",
    "sweep": "sweep",
}

DESCRIPTION = """\
tpusim: run PyTorch programs on a simulated TPU slice and see what they would cost.

examples:
  python -m tpusim chips                         # TPU generations and their key numbers
  python -m tpusim topology 3d:8x8x8             # a 512-chip v5p slice: links, wrap, bisection
  python -m tpusim collective all_reduce --bytes 1GiB --topology 3d:4x4x4
  python -m tpusim run examples/transformer.py --topology 3d:8x8x8 --mode all
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tpusim", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tpusim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        module = _command_module(module_name)
        if module is not None:
            module.add_parser(subparsers)
    return parser


def _command_module(module_name: str):
    try:
        return importlib.import_module(f"tpusim.cli.{module_name}")
    except ModuleNotFoundError as missing:
        if missing.name == f"tpusim.cli.{module_name}":
            return None  # a command whose module is not part of this build
        raise


VALUE_IS_A_FLAG = frozenset({"--fit-batch"})    # its value names the script's own flag: --fit-batch --batch


def _negative_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--max-step-time -5ms`` as ``--max-step-time=-5ms``: argparse reads a value that starts with "-" and a
    digit but is no plain number as a flag, and said only "expected one argument" (issue 44, H01); joined, the
    flag's own check says what is wrong with the value. So is ``--fit-batch --batch`` (``VALUE_IS_A_FLAG``)."""
    command = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    sub = command.choices.get(argv[0]) if command is not None and argv else None
    if sub is None:
        return argv
    takes_value = {flag for action in sub._actions if action.nargs is None for flag in action.option_strings}
    joined: list[str] = []
    for arg in argv:
        if (joined and joined[-1] in takes_value and len(arg) > 1 and arg[0] == "-"
                and ((arg[1].isdigit() and arg[1:2].isascii()) or joined[-1] in VALUE_IS_A_FLAG)):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # everything after the first "--" belongs to the user's script (`tpusim run model.py -- --lr 1`)
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = build_parser()
    own = _negative_values(parser, argv[:len(argv) - len(script_args) - (1 if "--" in argv else 0)])
    args = parser.parse_args(own)
    if script_args:
        args.script_args = script_args
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except TpusimError as error:
        # bytes that are no UTF-8 (a path from the environment) kept as escapes: a stream that refuses surrogates
        # raised UnicodeEncodeError on the error line itself (the CLI fuzz, issue 44)
        line = f"tpusim {args.command}: error: {error}".encode("utf-8", "backslashreplace").decode("utf-8")
        print(line, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `tpusim ... | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C before the script ran, or in a command with no report to save
        print(f"\ntpusim {args.command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
