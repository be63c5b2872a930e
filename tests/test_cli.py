"""The command line: --version, help on every command, bad input -> one line and exit code 2."""

import json
import subprocess
import sys

import pytest

from tpusim import __version__
from tpusim.cli.main import COMMANDS, main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version_through_python_dash_m():
    result = subprocess.run([sys.executable, "-m", "tpusim", "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.strip() == f"tpusim {__version__}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help_with_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_topology_json_has_the_documented_keys(capsys):
    code, out, _ = run_cli(capsys, "topology", "3d:8x8x8", "--json")
    info = json.loads(out)
    assert code == 0
    assert {"spec", "chip", "chips", "dims", "wrap", "links", "diameter_hops",
            "bisection_bytes_per_s"} <= set(info)
    # 8x8x8 wrapped: 512 chips x 6 ports / 2 ends per link = 1536 links; diameter 3 x 8/2 = 12 hops
    assert (info["chips"], info["links"], info["diameter_hops"]) == (512, 1536, 12)
    assert info["chip"] == "v5p" and info["wrap"] == [True, True, True]


def test_topology_summary_names_the_default_chip(capsys):
    code, out, _ = run_cli(capsys, "topology", "3d:2x2x2")
    assert code == 0
    assert "TPU v5p" in out and "default" in out
    assert "2x as long" in out  # no wraparound below a full cube, and the summary says what it costs


def test_no_wrap_flag_removes_wraparound(capsys):
    _, out, _ = run_cli(capsys, "topology", "3d:4x4x4", "--no-wrap", "--json")
    info = json.loads(out)
    # an open 4x4x4 mesh: 3 axes x 16 lines x 3 links = 144 links
    assert info["wrap"] == [False, False, False] and info["links"] == 144


@pytest.mark.parametrize("argv", [
    ["topology", "3d:8x8"],
    ["topology", "2d:0x4"],
    ["topology", "4d:2x2x2x2"],
    ["topology", "3d:8x8x8x"],
    ["topology", "3d:4x4x4", "--chip", "v5e"],      # v5e builds 2D slices only
    ["topology", "3d:32x32x32"],                    # larger than any v5p slice
    ["topology", "2d:4x4", "--chip", "v99"],        # unknown chip
    ["topology", "2d:4x4", "--wrap", "z"],          # 2D slice has no z axis
    ["topology", "2d:4x4", "--slices", "0"],
])
def test_bad_input_is_one_clear_line_and_exit_code_2(argv, capsys):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"tpusim {argv[0]}: error: ")
    assert "Traceback" not in err


def test_chips_table_lists_every_generation(capsys):
    from tpusim.hardware.spec import available_chips

    code, out, _ = run_cli(capsys, "chips")
    assert code == 0
    for name in available_chips():
        assert name in out
