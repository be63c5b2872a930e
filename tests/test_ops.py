"""tpusim.trace.ops: one family per op, read the same way by cost rules, fusion and the window cutter."""

import pytest

from tpusim.eager.windows import CUTS, Node, WindowCutter
from tpusim.trace import ops
from tpusim.trace.ops import Family, family_of, fusion_role


@pytest.mark.parametrize("name", ["aten::add_.Tensor", "add.out", "aten::add", "add_"])
def test_base_name_drops_namespace_overload_and_in_place(name):
    assert ops.base_name(name) == "add"


def test_dunder_names_keep_their_underscores():
    assert ops.base_name("aten::__and__.Tensor") == "__and__"


@pytest.mark.parametrize(("name", "family"), [
    ("aten::mm", Family.CONTRACTION), ("aten::convolution_backward", Family.CONTRACTION),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", Family.ATTENTION),
    ("aten::native_layer_norm_backward", Family.REDUCTION), ("aten::sum.dim_IntList", Family.REDUCTION),
    ("aten::embedding", Family.GATHER_SCATTER), ("aten::index_put_", Family.GATHER_SCATTER),
    ("aten::copy_", Family.DATA_MOVEMENT), ("aten::_foreach_copy_", Family.DATA_MOVEMENT),
    ("aten::sort.stable", Family.OPAQUE), ("aten::_foreach_mul_.Scalar", Family.ELEMENTWISE),
    ("aten::gelu", Family.ELEMENTWISE), ("aten::never_heard_of", Family.ELEMENTWISE),
])
def test_family_of_reads_the_one_table(name, family):
    assert family_of(name) == family


def test_every_family_has_a_unit_and_a_fusion_role():
    assert set(ops.FAMILIES) == set(Family)
    assert {info.role for info in ops.FAMILIES.values()} == {"contraction", "reduction", "elementwise", "opaque"}


def test_fusion_role_follows_the_family_unless_nothing_was_counted_or_it_runs_off_the_tensorcore():
    assert fusion_role(Family.CONTRACTION, "mxu", 10.0, 0.0) == "contraction"
    assert fusion_role(Family.REDUCTION, "vpu", 10.0, 0.0) == "reduction"
    assert fusion_role(Family.ELEMENTWISE, "vpu", 0.0, 4.0) == "elementwise"
    assert fusion_role(Family.ELEMENTWISE, "vpu", 0.0, 0.0) == "opaque"      # no cost rule applied
    assert fusion_role(Family.GATHER_SCATTER, "sparsecore", 10.0, 0.0) == "opaque"
    assert fusion_role(Family.OPAQUE, "vpu", 10.0, 0.0) == "opaque"


def test_the_cutter_counts_windows_that_held_ops_and_why_they_ended():
    cutter = WindowCutter(limit=3, repeats=False)
    assert [cutter.admit(Node(key=i)) for i in range(4)] == [None, None, None, "size"]
    assert cutter.admit(Node(key=9, fusible=False)) == "opaque"   # ends the window of one op; it runs alone
    assert cutter.admit(Node(key=9, fusible=False)) == "opaque"   # nothing pending: counted nowhere
    assert cutter.boundary("sync") == "sync" and cutter.boundary("end") == "end"
    assert cutter.windows == 2 and dict(cutter.cuts) == {"size": 1, "opaque": 1}


def test_an_unknown_cut_reason_is_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match="accepted: sync"):
        WindowCutter().boundary("lunch")
    assert {"sync", "opaque", "size", "alias"} <= set(CUTS)
