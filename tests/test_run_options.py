"""RunOptions is the run pipeline's one input: `tpusim run`'s parser fills it, and the command line it writes
back (for the plugin's and sweep's fresh processes) parses into the same options."""

from __future__ import annotations

import pytest

from tpusim.cli.main import build_parser
from tpusim.eager.modes import MODES
from tpusim.errors import TpusimError
from tpusim.run.options import RunOptions, modes_of

pytestmark = pytest.mark.sim


def parsed(argv: list[str]) -> RunOptions:
    """What `tpusim run` makes of ``argv`` (the script's arguments after "--" as main() splits them)."""
    script_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:len(argv) - len(script_args) - (1 if "--" in argv else 0)])
    args.script_args = script_args
    return RunOptions.from_args(args)


@pytest.mark.parametrize("options", [
    RunOptions(script="examples/mlp.py"),
    RunOptions(script="train.py", script_args=("--lr", "1", "--", "x"), chip="v5e", topology="2d:4x4",
               modes=modes_of("fused,debug"), numerics="off", placement="tp=x", compare_placements=True,
               ranks="one", tokens_per_step=8192, max_records=1000, fail_links="1", fault_seed="3",
               out="reports/x", quiet=True),
    RunOptions(script="m.py", target="pjrt", pjrt_timeout_s=None, fail_chips="(0,0,0)"),
    RunOptions(script="m.py", target="pjrt", pjrt_timeout_s=12.5),
])
def test_the_command_line_of_options_parses_back_into_them(options):
    argv = options.argv()
    assert argv[1:4] == ["-m", "tpusim", "run"]
    assert parsed(argv[3:]) == options


def test_modes_are_resolved_once_into_their_objects():
    assert modes_of("all") == tuple(MODES.values())
    assert modes_of("Fused, defer_never") == (MODES["fused"], MODES["strict"])
    assert parsed(["run", "m.py", "--mode", "debug"]).modes == (MODES["debug"],)
    with pytest.raises(TpusimError, match="unknown eager mode turbo"):
        modes_of("turbo")
