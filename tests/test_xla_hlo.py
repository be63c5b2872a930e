"""Reading XLA's scheduled HLO (tpusim/xla/hlo.py) on a module written here in XLA's own print format,
counted by hand: fusions once per run (a while body as many times as its condition says), a fused
computation's insides not counted again, async collectives with the cycles scheduled between start and done."""

from tpusim.xla.hlo import parse_program, shape_bytes

MODULE = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(bf16[256,2048]{1,0})->bf16[256,2048]{1,0}}

%fused_computation (param_0: bf16[256,2048]) -> bf16[256,2048] {
  %param_0 = bf16[256,2048]{1,0:T(8,128)(2,1)} parameter(0)
  ROOT %inner = bf16[256,2048]{1,0} fusion(%param_0), kind=kLoop, calls=%nested, backend_config={"window_config":{"estimated_cycles":"999"}}
}

%body (p: (s32[], bf16[256,2048])) -> (s32[], bf16[256,2048]) {
  %p = (s32[], bf16[256,2048]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[256,2048]{1,0} get-tuple-element(%p), index=1
  %cp-start = (bf16[256,2048]{1,0}, bf16[256,2048]{1,0}, u32[], u32[]) collective-permute-start(%x), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %matmul_fusion = bf16[256,2048]{1,0:T(8,128)(2,1)} fusion(%x), kind=kOutput, calls=%fused_computation, backend_config={"window_config":{"estimated_cycles":"1000","estimated_vmem_bytes":"4096"}}
  %cp-done = bf16[256,2048]{1,0} collective-permute-done(%cp-start)
  ROOT %t = (s32[], bf16[256,2048]{1,0}) tuple(%i, %cp-done)
}

%cond (p.1: (s32[], bf16[256,2048])) -> pred[] {
  %p.1 = (s32[], bf16[256,2048]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %constant.7 = s32[] constant(4)
  ROOT %lt = pred[] compare(%i.1, %constant.7), direction=LT
}

ENTRY %main (a: bf16[256,2048]) -> bf16[256,2048] {
  %a = bf16[256,2048]{1,0} parameter(0)
  %first = bf16[256,2048]{1,0} fusion(%a), kind=kLoop, calls=%fused_computation, backend_config="{\\"window_config\\":{\\"estimated_cycles\\":\\"300\\"}}"
  %copy-start = (bf16[256,2048]{1,0}, bf16[256,2048]{1,0:S(1)}, u32[]) copy-start(%first), backend_config={"estimated_cycles":"50"}
  %zero = s32[] constant(0)
  %init = (s32[], bf16[256,2048]{1,0}) tuple(%zero, %first)
  %loop = (s32[], bf16[256,2048]{1,0}) while(%init), condition=%cond, body=%body
  %y = bf16[256,2048]{1,0} get-tuple-element(%loop), index=1
  %all-reduce = bf16[256,2048]{1,0} all-reduce(%y), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  ROOT %last = bf16[256,2048]{1,0} fusion(%all-reduce), kind=kLoop, calls=%fused_computation, backend_config={"window_config":{"estimated_cycles":"200"}}
}
"""


def test_the_fusions_and_cycles_of_one_execution():
    program = parse_program(MODULE)
    assert [(f.name, f.kind, f.times) for f in program.fusions] == [
        ("first", "kLoop", 1), ("matmul_fusion", "kOutput", 4), ("last", "kLoop", 1)]
    assert program.kernels == 6
    assert program.fusions[1].estimated_vmem_bytes == 4096
    assert program.estimated_cycles == 300 + 4 * 1000 + 200 + 50      # the copy's own estimate counts too


def test_collectives_in_schedule_order_with_what_overlaps_them():
    program = parse_program(MODULE)
    body = [c for c in program.collectives if c.is_async]
    assert len(body) == 4 and {(c.opcode, c.overlapped_cycles) for c in body} == {("collective-permute", 1000)}
    assert program.collectives[-1].opcode == "all-reduce" and not program.collectives[-1].is_async
    assert program.collectives[-1].bytes == 256 * 2048 * 2


def test_shape_bytes_reads_tuples_and_skips_layouts():
    assert shape_bytes("(bf16[128,512]{1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)})") == 128 * 512 * 2 + 4
    assert shape_bytes("f32[]") == 4 and shape_bytes("pred[3]") == 3
