"""The real TPU compiler, deviceless (tpusim/xla/; the xla extra, skipped without it).

The independent truth is jax's own ahead-of-time path: ``jax.jit(f).lower(...).compile()`` for the same
virtual TPU device, run in a process of its own, compared with what tpusim's worker makes of the same
function's StableHLO text: the same fusions, XLA's same estimated cycles, the same peak memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tpusim.hardware.spec import load_chip
from tpusim.xla.compiler import QUIET_ENV, XlaUnavailable, compile_stablehlo, missing, target_for
from tpusim.xla.hlo import parse_program

pytestmark = [pytest.mark.xla, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

JAX_SIDE = """
import json, re, sys
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding
topology, out = sys.argv[1], sys.argv[2]
device = topologies.get_topology_desc(topology, "tpu").devices[0]
def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2
specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=SingleDeviceSharding(device))
         for s in ((256, 512), (512, 1024), (1024, 512))]
lowered = jax.jit(mlp).trace(*specs).lower(lowering_platforms=("tpu",))
compiled = lowered.compile()
json.dump({"stablehlo": lowered.as_text(), "hlo": compiled.as_text(),
           "peak": compiled.memory_analysis().peak_memory_in_bytes}, open(out, "w"))
"""


def jax_compile(topology: str, tmp_path) -> dict:
    out = tmp_path / "jax.json"
    done = subprocess.run([sys.executable, "-c", JAX_SIDE, topology, str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **QUIET_ENV})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == "", done.stderr           # the quiet settings leave libtpu nothing to say
    return json.loads(out.read_text())


def entry_fusions(hlo: str) -> list[int]:
    """Each ENTRY fusion's estimated cycles, read with a plain regex (not tpusim's parser)."""
    entry = hlo[hlo.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    return [int(m.group(1)) for line in entry.splitlines() if re.search(r"= \S+ fusion\(", line)
            for m in [re.search(r'estimated_cycles\\?":\\?"(\d+)', line)] if m]


@pytest.mark.parametrize("chip", ["v5e", "v5p"])
def test_tpusim_compiles_what_jax_compiles(chip, tmp_path):
    target = target_for(load_chip(chip))
    truth = jax_compile(target.topology, tmp_path)
    compiled = compile_stablehlo(truth["stablehlo"], target)
    program = parse_program(compiled.hlo)
    cycles = entry_fusions(truth["hlo"])
    assert len(program.fusions) == len(cycles) >= 1
    assert sorted(f.estimated_cycles for f in program.fusions) == sorted(cycles)
    assert compiled.memory["peak_memory_in_bytes"] == truth["peak"]
    again = compile_stablehlo(truth["stablehlo"], target)            # the disk cache answers the second time
    assert again.cached and again.hlo == compiled.hlo


def test_a_module_the_compiler_refuses_falls_back_with_its_reason():
    with pytest.raises(XlaUnavailable, match="refused the program"):
        compile_stablehlo("module { this is not stablehlo }", target_for(load_chip("v5e")))


ATTENTION = """
import json, sys
import jax, jax.numpy as jnp
def block(x, wq, wk, wv, wo):
    q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (wq, wk, wv))
    scores = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) / 8.0, axis=-1)
    return jnp.einsum("bhse,hed->bsd", jnp.einsum("bhst,bhte->bhse", scores, v), wo)
shapes = ((2, 256, 512), (512, 8, 64), (512, 8, 64), (512, 8, 64), (8, 64, 512))
specs = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
grad = jax.grad(lambda *a: block(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3, 4))
print(json.dumps(jax.jit(grad).trace(*specs).lower(lowering_platforms=("tpu",)).as_text()))
"""


def test_the_fusions_work_adds_up_to_xlas_own_flop_count():
    """Attention's forward and backward (batched matmuls XLA writes as windowed convolutions): the FLOPs read
    from each fusion sum to what the compiled executable's cost analysis counts."""
    done = subprocess.run([sys.executable, "-c", ATTENTION], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **QUIET_ENV})
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = compile_stablehlo(json.loads(done.stdout), target_for(load_chip("v5p")))
    program = parse_program(compiled.hlo)
    flops = sum(f.work.flops * f.times for f in program.fusions)
    assert any(f.work.matmul and f.work.matmul[0] > 1 for f in program.fusions)     # batched: taps counted
    assert flops == pytest.approx(compiled.cost["flops"], rel=0.01)
