"""Slice shapes (issue 18 item 6): a topology no chip generation is offered in is priced with a note that
says so, what the generation's slice shapes are and where that is published; real shapes get no note.
The truth is the Cloud TPU docs' configuration tables as the chip files quote them."""

import dataclasses
import json

import pytest
from factories import training_trace

from tpusim.cli.compare import notes
from tpusim.cli.main import main
from tpusim.eager.modes import get_mode
from tpusim.errors import TpusimError
from tpusim.hardware.spec import available_chips, chips_dir, load_chip
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report
from tpusim.report.html import render_html
from tpusim.report.summary import summary_table
from tpusim.slice.shapes import is_slice_shape
from tpusim.slice.topology import build_slice

# Published shapes: Cloud TPU v5p doc's configurations table, the v5e/v6e docs' 1x1 ... 16x16 and
# the v4 rule "A, B, C all <= 4 or all multiples of 4" (types-topologies).
PUBLISHED = [("v5p", "3d:2x2x1"), ("v5p", "3d:2x4x4"), ("v5p", "3d:4x4x8"), ("v5p", "3d:8x16x16"),
             ("v5p", "3d:16x16x24"), ("v5p", "3d:8x16x48"), ("v4", "3d:12x12x24"), ("v4", "3d:2x2x4"),
             ("v5e", "2d:16x16"), ("v5e", "2d:8x16"), ("v6e", "2d:4x8"), ("v6e", "2d:1x1"), ("v7", "3d:16x24x24")]
NOT_OFFERED = [("v5p", "3d:3x5x7"), ("v5p", "3d:4x4x6"), ("v5p", "3d:2x2x3"), ("v4", "3d:3x3x3"),
               ("v5e", "2d:3x16"), ("v6e", "2d:16x12"), ("v7", "3d:4x4x5")]


@pytest.mark.parametrize("chip, topology", PUBLISHED)
def test_a_published_shape_has_no_note(chip, topology):
    assert build_slice(topology, chip=chip).shape_note is None


@pytest.mark.parametrize("chip, topology", [("v5p", "3d:1x1x1"), ("v5p", "3d:1x2x1"), ("v6e", "2d:1x4"),
                                            ("v5p", "2d:2x2"), ("v5p", "3d:4x2x2")])
def test_part_of_a_host_and_any_axis_order_are_slices(chip, topology):
    assert build_slice(topology, chip=chip).shape_note is None


@pytest.mark.parametrize("chip, topology", NOT_OFFERED)
def test_a_shape_not_offered_is_priced_with_a_note_naming_the_shapes_and_the_doc(chip, topology):
    slice_ = build_slice(topology, chip=chip)
    shape = topology.split(":")[1]
    note = slice_.shape_note
    assert note.startswith(f"{shape} is not a {chip} slice shape; {chip} slices are ")
    assert ", ".join(load_chip(chip).slice_shapes) in note and "https://" in note
    assert slice_.num_chips > 0                       # still priced: a what-if study stays possible


def test_the_v5p_note_cites_the_v5p_doc_and_the_cube_rule():
    note = build_slice("3d:3x5x7").shape_note
    assert "every axis a multiple of 4 (whole 4x4x4 cubes)" in note
    assert "https://docs.cloud.google.com/tpu/docs/v5p" in note


def test_a_custom_chip_without_slice_shapes_is_not_checked():
    custom = dataclasses.replace(load_chip("v5p"), name="mychip", slice_shapes=())
    assert build_slice("3d:3x5x7", chip=custom).shape_note is None
    assert is_slice_shape((3, 5, 7), custom)


@pytest.mark.parametrize("chip", available_chips())
def test_every_chip_file_lists_its_slice_shapes_with_their_axes(chip):
    spec = load_chip(chip)
    assert spec.slice_shapes
    assert all(shape.count("x") + 1 == spec.torus_dims for shape in spec.slice_shapes)
    assert all(is_slice_shape(tuple(map(int, s.split("x"))), spec) for s in spec.slice_shapes)


def test_a_malformed_shape_in_a_chip_file_is_one_clear_error(tmp_path):
    text = (chips_dir() / "v5p.toml").read_text()
    bad = tmp_path / "v5p.toml"
    bad.write_text(text.replace('value = ["2x2x1", "2x2x2", "2x2x4", "2x4x4"]', 'value = ["2x2"]'))
    with pytest.raises(TpusimError, match=r"\[slice_shapes\] lists '2x2'; each shape is 3 axis lengths"):
        load_chip(bad)


def test_the_note_reaches_topology_summary_html_json_and_compare(capsys, tmp_path):
    assert main(["topology", "3d:3x5x7"]) == 0
    assert "warning          3x5x7 is not a v5p slice shape" in capsys.readouterr().out
    assert main(["topology", "3d:3x5x7", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape_note"].startswith("3x5x7 is not a v5p")
    trace = training_trace()
    reports = {}
    for topology in ("3d:3x5x7", "3d:4x4x4"):
        slice_ = build_slice(topology)
        timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
        reports[topology] = build_report(RunInfo("model.py"), trace, slice_, timelines)
    odd, real = reports["3d:3x5x7"], reports["3d:4x4x4"]
    assert odd.slice.shape_note and real.slice.shape_note is None
    assert "warning: 3x5x7 is not a v5p slice shape" in summary_table(odd, "out")
    assert "not a v5p slice shape" not in summary_table(real, "out")
    assert "Slice shape:</b> 3x5x7 is not a v5p slice shape" in render_html(odd, {})
    assert any(n.startswith("A: 3x5x7 is not a v5p") for n in notes(odd, real))
    assert not any("slice shape" in n for n in notes(real, real))
