"""The bundled examples/transformer.py under Fused eager: its clusters compile once per distinct layer.

Independent truth: a deeper model of the same layer shape adds layers, not programs. Layers 1 and 2
differ from the rest (the repeat is first seen when layer 2 ends, so the cut after it joins a cluster
the later layers do not have); from layer 3 on, every layer's clusters (forward and backward) are the
ones already compiled, so the distinct clusters compiled stay the same from 3 layers to 5 while the
clusters run grow by the same number per layer.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

import tpusim.backend as tb
from tpusim.eager.modes import get_mode
from tpusim.hardware.spec import load_chip
from tpusim.pricing.planning import plan

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transformer.py"


def fused_plan(layers: int, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(sys, "argv", ["transformer.py", "--steps", "1", "--batch", "2", "--seq", "16",
                                      "--d-model", "32", "--vocab", "64", "--layers", str(layers)])
    with tb.recording() as rec:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    return plan(rec.trace, get_mode("fused"), load_chip("v5p")).meta


def test_the_transformers_fused_clusters_compile_once_per_distinct_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    metas = {layers: fused_plan(layers, monkeypatch) for layers in (3, 4, 5)}
    compiled = {layers: m["fusion"].clusters_compiled for layers, m in metas.items()}
    clusters = {layers: m["fusion"].windows for layers, m in metas.items()}
    assert compiled[3] == compiled[4] == compiled[5]
    per_layer = clusters[4] - clusters[3]
    assert per_layer > 0 and clusters[5] - clusters[4] == per_layer
    assert all(m["fusion"].cuts.get("repeated", 0) > 0 for m in metas.values())
    # the compile cache agrees: no more misses for a deeper model
    assert len({m["compile_cache"].misses for m in metas.values()}) == 1
