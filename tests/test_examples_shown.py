"""Every `python -m tpusim ...` command the README, the manual and the --help texts show parses with
tpusim's own parser, and every flag it passes to an example script (after `--`, or swept by --script-arg) is
one that script takes (issue 31, item 6: `tpusim sweep --help` showed flags examples/transformer.py lacks).

The commands themselves are run by the tests of each command (test_cli, test_run, test_sweep_readme,
test_check_readme, test_docs, ...); this test keeps the examples as written in step with them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tpusim.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m tpusim ((?:[^\n`\\]|\\\n)+)")


def _help_texts() -> dict[str, str]:
    parser = build_parser()
    texts = {"--help": parser.format_help()}
    subparsers = next(a for a in parser._actions if a.dest == "command")
    for name, sub in subparsers.choices.items():
        texts[f"{name} --help"] = sub.format_help()
    return texts


def _shown() -> list[tuple[str, str]]:
    """(where, command line after `python -m tpusim `) for every example shown."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted(
        (ROOT / "docs").rglob("*.md"))]}
    sources.update(_help_texts())
    found = []
    for where, text in sources.items():
        for match in COMMAND.finditer(text):
            line = match.group(1).replace("\\\n", " ").split(" && ")[0].split(" | ")[0].split(" # ")[0].strip()
            usage = re.search(r"\[-|\b[A-Z]{3,}\b", line)        # a usage line (run [-h] ..., KIND --bytes SIZE)
            if line and not usage and not line.startswith(("...", "<")) and "{" not in line:
                found.append((where, line))
    return found


SHOWN = _shown()


def _script_flags(script: Path) -> set[str]:
    return set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", script.read_text()))


def test_examples_are_found_in_every_place_that_shows_them() -> None:
    places = {where for where, _ in SHOWN}
    assert {"README.md", "run --help", "sweep --help", "check --help"} <= places
    assert len(SHOWN) > 40


@pytest.mark.parametrize("where, line", SHOWN, ids=[f"{w}: {c[:60]}" for w, c in SHOWN])
def test_a_shown_command_parses_and_passes_the_script_only_flags_it_takes(where: str, line: str) -> None:
    argv = shlex.split(line)
    assert argv[0] in COMMANDS or argv[0] in ("--help", "--version"), f"{where}: unknown command {argv[0]}"
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[:len(argv) - len(script_args) - (1 if "--" in argv else 0)]
    try:
        args = build_parser().parse_args(ours)
    except SystemExit as stop:
        assert stop.code == 0 and ("--help" in ours or "--version" in ours), f"{where}: {line} does not parse"
        return
    target = next((a for a in ours[1:] if a.endswith(".py")), None)
    if target is None or not (ROOT / target).is_file():
        return
    takes = _script_flags(ROOT / target)
    passed = {a.split("=")[0] for a in script_args if a.startswith("--")}
    swept = {f"--{spec.split('=')[0]}" for spec in getattr(args, "script_arg", None) or []}
    missing = sorted((passed | swept) - takes)
    assert not missing, f"{where}: {target} takes no {', '.join(missing)} ({line})"
