"""Fused eager clusters as one program of their ops (tpusim/xla/clusters.py): the ops' one-op StableHLO
programs composed into one module, wired as the cluster reads them, returning what leaves it. The truth: the
composed text parses as MLIR in jax's own context and computes, run by jax on the CPU, what the ops
computed one by one."""

import jax
import numpy as np
import pytest
from jax._src import compiler
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from test_fusion import ew, free, kernels, toy_chip

from tpusim.eager.fusion import ClusterCall, CompiledProgram, CompilerOutput, cluster_call, fuse
from tpusim.trace.records import StepMarker, renumber
from tpusim.xla.clusters import compose

MUL = """module @jit_fn attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>) -> (tensor<4xf32> {jax.result_info = "r"}) {
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
EXP = """module @jit_fn attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32> {jax.result_info = "result[0]"}) {
    %0 = call @helper(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.exponential %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""
CALL = ClusterCall(("mul", "exp", "mul"), ((("in", 0), ("in", 1)), (("op", 0, 0),), (("op", 1, 0), ("in", 0))),
                   ((2, 0),), 2)


def run_on_cpu(text: str, *inputs: np.ndarray) -> list[np.ndarray]:
    """A StableHLO module compiled and run by jax's CPU client (jax is a dependency)."""
    device = jax.devices("cpu")[0]
    with mlir.make_ir_context():
        module = mlir.ir.Module.parse(text)
        executable = device.client.compile_and_load(module, _jax.DeviceList((device,)),
                                                    compiler.get_compile_options(num_replicas=1, num_partitions=1))
    return [np.asarray(out) for out in executable.execute([jax.device_put(x, device) for x in inputs])]


def test_a_clusters_ops_compose_into_one_module_that_computes_them_in_turn():
    text = compose(CALL, {"mul": MUL, "exp": EXP})
    assert text.count("func.func private @op") == 4 and "@op1_helper" in text and text.count("@helper") == 0
    x, y = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    (out,) = run_on_cpu(text, x, y)
    np.testing.assert_allclose(out, np.exp(x * y) * x, rtol=1e-6)       # mul, then exp, then mul by x again


def test_a_cluster_with_an_op_that_has_no_program_is_left_to_the_model():
    assert compose(CALL, {"mul": MUL}) is None
    assert compose(ClusterCall(("mul",), ((("in", 0),),), ((0, 0),), 1), {"mul": MUL}) is None   # arity differs


def test_the_cluster_call_wires_each_op_to_its_producer_and_lists_what_leaves():
    ops = list(renumber([ew("mul", [1, 2], 3), ew("exp", [3], 4), ew("mul", [4, 1], 5)]))
    call = cluster_call(ops, [ops[2].outputs[0]])
    assert call.wiring == ((("in", 0), ("in", 1)), (("op", 0, 0),), (("op", 1, 0), ("in", 0)))
    assert call.exits == ((2, 0),) and call.entering == 2


def test_fused_runs_a_compiled_cluster_as_xlas_kernels():
    # the intermediates die inside: one executable (TorchTPU's split graph ends one at each value held)
    records = renumber([ew("mul", [1, 2], 3), ew("exp", [3], 4), free(3), ew("mul", [4, 1], 5), free(4),
                        StepMarker(0, 1)])
    found = []
    fuse(records, toy_chip(), clusters_out=found)
    ((number, first, call),) = found
    model = kernels(fuse(records, toy_chip()).records)
    xla = CompiledProgram(tuple(model))                # stand-in kernels: the first of them replaces the cluster
    fused = kernels(fuse(records, toy_chip(), compiled=CompilerOutput(clusters={call: xla})).records)
    assert [k.cluster for k in fused] == [number] * len(model) and first == records[0].seq
    assert fused[0].parts == (records[0], records[1], records[3]) and fused[0].inputs and fused[-1].outputs
    with pytest.raises(StopIteration):
        next(k for k in fused if k.cluster != number)
