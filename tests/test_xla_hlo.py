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


WORK = """HloModule jit_work, is_scheduled=true

%dot_computation (p0: bf16[4,64,128], p1: bf16[4,128,256]) -> f32[4,64,256] {
  %p0 = bf16[4,64,128]{2,1,0} parameter(0)
  %p1 = bf16[4,128,256]{2,1,0} parameter(1)
  %dot = f32[4,64,256]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %exp = f32[4,64,256]{2,1,0} exponential(%dot)
}

%conv_computation (q0: bf16[512,1024], q1: bf16[1024,384]) -> bf16[512,384] {
  %q0 = bf16[512,1024]{1,0} parameter(0)
  %q1 = bf16[1024,384]{1,0} parameter(1)
  %neg = bf16[512,1024]{1,0} negate(%q0)
  ROOT %conv = bf16[512,384]{1,0} convolution(%neg, %q1), dim_labels=bf_io->bf
}

%update_computation (buffer: bf16[16,1024], source: bf16[64,1024]) -> bf16[16,1024] {
  %buffer = bf16[16,1024]{1,0} parameter(0)
  %source = bf16[64,1024]{1,0} parameter(1)
  %piece = bf16[2,1024]{1,0} slice(%source), slice={[0:2], [0:1024]}
  %zero = u32[] constant(0)
  ROOT %updated = bf16[16,1024]{1,0} dynamic-update-slice(%buffer, %piece, %zero, %zero)
}

ENTRY %main (a: bf16[4,64,128], b: bf16[4,128,256], c: bf16[512,1024], d: bf16[1024,384], e: bf16[16,1024], f: bf16[64,1024]) -> bf16[16,1024] {
  %a = bf16[4,64,128]{2,1,0} parameter(0)
  %b = bf16[4,128,256]{2,1,0} parameter(1)
  %c = bf16[512,1024]{1,0} parameter(2)
  %d = bf16[1024,384]{1,0} parameter(3)
  %e = bf16[16,1024]{1,0} parameter(4)
  %f = bf16[64,1024]{1,0} parameter(5)
  %batched = f32[4,64,256]{2,1,0} fusion(%a, %b), kind=kOutput, calls=%dot_computation
  %projected = bf16[512,384]{1,0} fusion(%c, %d), kind=kOutput, calls=%conv_computation
  ROOT %in_place = bf16[16,1024]{1,0} fusion(%e, %f), kind=kLoop, calls=%update_computation
}
"""


def test_each_fusions_work_and_bytes_counted_by_hand():
    batched, projected, in_place = parse_program(WORK).fusions
    # a batched dot: 2 x (4 x 64 x 256 outputs) x 128 contracted; one exp per output element
    assert batched.work.matmul == (4, 64, 128, 256) and batched.work.dtype == "bf16"
    assert batched.work.flops == 2 * 4 * 64 * 256 * 128 and batched.work.transcendentals == 4 * 64 * 256
    assert (batched.read_bytes, batched.written_bytes) == ((4 * 64 * 128 + 4 * 128 * 256) * 2, 4 * 64 * 256 * 4)
    # a matmul written as a convolution (bf_io->bf): k = 1024 input features, n = 384 output features
    assert projected.work.matmul == (1, 512, 1024, 384)
    assert projected.work.flops == 2 * 512 * 1024 * 384 + 512 * 1024          # the negate's elements too
    # an in-place update: the buffer is neither read nor rewritten, the source is read as its slice
    assert in_place.work.matmul is None and in_place.work.flops == 0
    assert (in_place.read_bytes, in_place.written_bytes) == (2 * 1024 * 2, 2 * 1024 * 2)
    assert in_place.output_bytes == 16 * 1024 * 2


CONTINUATION = """HloModule jit_overlap, is_scheduled=true

%start_computation (s0: bf16[512,1024]) -> (bf16[512,1024], bf16[4096,1024]) {
  %s0 = bf16[512,1024]{1,0} parameter(0)
  %gather = bf16[4096,1024]{1,0} all-gather(%s0), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %begin = (bf16[512,1024]{1,0}, bf16[4096,1024]{1,0}) custom-call(%gather), custom_call_target="AsyncCollectiveStart"
}

%matmul_computation (m0: bf16[1024,1024], m1: bf16[1024,1024]) -> bf16[1024,1024] {
  %m0 = bf16[1024,1024]{1,0} parameter(0)
  %m1 = bf16[1024,1024]{1,0} parameter(1)
  ROOT %product = bf16[1024,1024]{1,0} convolution(%m0, %m1), dim_labels=bf_io->bf
}

%done_computation (d0: bf16[512,1024], d1: bf16[4096,1024]) -> bf16[4096,1024] {
  %d0 = bf16[512,1024]{1,0} parameter(0)
  %d1 = bf16[4096,1024]{1,0} parameter(1)
  %again = bf16[4096,1024]{1,0} all-gather(%d0), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %end = bf16[4096,1024]{1,0} custom-call(%d0, %d1, %again), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (shard: bf16[512,1024], x: bf16[1024,1024]) -> bf16[1024,1024] {
  %shard = bf16[512,1024]{1,0} parameter(0)
  %x = bf16[1024,1024]{1,0} parameter(1)
  %async-collective-start = (bf16[512,1024]{1,0}, bf16[4096,1024]{1,0}) fusion(%shard), kind=kCustom, calls=%start_computation
  %square = bf16[1024,1024]{1,0} fusion(%x, %x), kind=kOutput, calls=%matmul_computation
  %async-collective-done = bf16[4096,1024]{1,0} fusion(%shard, %async-collective-start), kind=kCustom, calls=%done_computation
  ROOT %after = bf16[1024,1024]{1,0} fusion(%square, %square), kind=kOutput, calls=%matmul_computation
}
"""


def test_an_async_collective_fusion_is_a_start_and_a_done_around_the_kernels_it_overlaps():
    """XLA:TPU's continuation fusion: the AsyncCollectiveStart/Done fusions are the collective's start and done
    (one chain), not kernels; the shard's bytes are what each device sends."""
    program = parse_program(CONTINUATION)
    steps = [(s.what, s.opcode or s.fusion.name) for s in program.schedule]
    assert steps == [("start", "all-gather"), ("kernel", "square"), ("done", "all-gather"), ("kernel", "after")]
    start, done = program.schedule[0], program.schedule[2]
    assert start.key == done.key == "chain:0" and start.bytes == 512 * 1024 * 2 and start.dtype == "bf16"
    assert [f.name for f in program.fusions] == ["square", "after"]
