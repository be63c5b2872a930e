"""Cases from MaxText training runs: one training step of a decoder LLM.

Sources: the MaxText README's "Runtime Performance Results" (github.com/AI-Hypercomputer/maxtext,
formerly google/maxtext), rows V23 (v5p), V24 (v5e multislice) and V25 (v4) of
../shared/research/validation-sources.md. Each row gives TFLOP/s per chip; MaxText computes it as (its
FLOP count of one step per device) / (step time), so the step time a row implies is that FLOP count
divided by the published rate, with the formula of the MaxText commit that published the row
(``Decoder.maxtext_tflops``). And Google's MLPerf Training v4.0 GPT-3 175B submissions on v5p (rows
V2-V4; ``MLPERF_RUNS``), run with MaxText: their MLLOG block times, which include the eval passes
(priced as forward-only steps, ``step_trace(train=False)``). The 512-chip submission is held out for good.

**What is priced.** Not a recorded PyTorch program: the step is built here from closed-form layer
shapes (``step_trace``) as the OpRecords / CollectiveRecords the backend would record, one rank's
view (SPMD), and priced with ``tpusim.pricing.price`` in fused mode. The modelling choices, each
one a reading of MaxText's code at that commit and of XLA's behaviour, are:

- **Model** (``Decoder``): MaxText's default decoder at the commit (2024 v5p table: llama2 block,
  RMSNorm, MHA with head_dim 128, SwiGLU MLP, vocab 32000, separate logits matrix; 2023 v5e and v4
  tables: head_dim 256, ReLU MLP, vocab 32768, logits through the embedding matrix), sizes from
  ``global_parameter_scale`` exactly as that commit's ``pyconfig.get_individual_scales`` does (v4,
  2023-04: the multiplicative ``scale`` of that time). Sequence 2048 (v4: 1024); the embedding is a
  one-hot matmul (``use_iota_embed=true``; assumed for v4 too).
- **Sharding** (MaxText's logical axis rules): weights sharded over ``fsdp`` (embed) and ``tensor``
  (heads, mlp, vocab); activations between layers [batch/fsdp, seq, embed/tensor]. So per layer a
  tensor-parallel group all-gathers each matmul input over ``tensor`` and reduce-scatters each
  partial-sum output back (4 collectives per layer forward, their transposes backward); every
  layer's weights are all-gathered over ``fsdp`` before use (forward, and again backward) and their
  gradients reduce-scattered over ``fsdp``; with several slices, the gradient shards are all-reduced
  over DCN (``dcn_data_parallelism``). The tensor axis is one physical torus axis of its length
  (what ``jax.experimental.mesh_utils`` picks), fsdp the others.
- **Overlap** (XLA's latency-hiding scheduler, enabled by the runs' ``--xla_tpu_enable_async_collective_fusion``
  flags): every collective is asynchronous and an op waits only for the collectives whose results
  it reads; the next layer's weight all-gather is issued one layer ahead; weight-gradient matmuls
  are placed after the activation-gradient collective they can hide. Tensor-parallel all-gathers in
  the forward pass have no independent work beside them and are exposed.
- **Data parallelism** (MLPerf runs): ``ici_data_parallelism`` is one more torus axis; each gradient
  shard is all-reduced over it after the fsdp reduce-scatter. **int8** (``quantization=int8``, AQT
  with int8 forward, dlhs and drhs dots): the projection matmuls run at the int8 MXU rate; logits,
  embedding and attention stay bf16; the quantize/scale work is taken as fused into the dots.
- **Remat**: ``minimal`` (jax ``checkpoint_dots_with_no_batch_dims``) saves the projection matmul
  outputs (as the logical, sharded tensors: after the reduce-scatter) and recomputes norms, RoPE,
  attention and the activation function in the backward pass, with the tensor all-gathers that
  feed the weight-gradient matmuls; ``full`` recomputes the whole layer forward;
  ``save_dot_except_logits`` saves the same dots as ``minimal``, and ``save_dot_except_logits_ffn1``
  recomputes the MLP's first dot as well.
- **Kernels**: flash attention (2 score-sized matmuls forward, 5 backward, as tpusim's backend
  prices ``scaled_dot_product_attention``): in 2024 the splash kernel with a causal mask in 512 x 512
  blocks, which computes the 10 of 16 blocks on or below the diagonal (0.625 of the scores); in 2023
  the Pallas flash kernel was called with ``causal=False`` (all scores); in 2023-04 (v4) there was no
  flash kernel: the scores and softmax probabilities of every head go through HBM (bf16); the logits matmul in bf16
  at DEFAULT precision with f32 output; AdamW on the f32 parameter shard as one elementwise kernel;
  gradient clipping as one reduction. Small cross-tensor all-reduces of norm statistics and of the
  loss are left out (a few microseconds each).
- **Program**: each step is one compiled program (``OpRecord.program``), fused as XLA would; no
  alloc/free records, so every kernel's output goes through HBM. Two steps are priced and the second
  is the step time (the first pays compilation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tpusim.eager.modes import get_mode
from tpusim.hardware.spec import ChipSpec
from tpusim.pricing import price
from tpusim.pricing.timeline import Timeline
from tpusim.slice.topology import build_slice
from tpusim.trace.cost_rules import Work, flash_attention, gemm
from tpusim.trace.ops import Family, unit_of
from tpusim.trace.records import CollectiveRecord, OpRecord, Record, StepMarker, TensorMeta, Trace
from tpusim.validate.case import Case, Prediction

FUSED = get_mode("fused")     # the mode the hand-built step traces are priced in

MAXTEXT = "https://github.com/AI-Hypercomputer/maxtext"
BF16, F32 = 2, 4


# --------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class Decoder:
    """A MaxText decoder-only transformer, sized as the config of one published run."""

    emb: int
    heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int
    mlp_matrices_in: int = 2        # SwiGLU (silu, linear): 2 input projections; ReLU: 1
    tied_logits: bool = False       # logits through the embedding matrix (logits_via_embedding)
    seq: int = 2048
    attention_kept: float = 1.0     # share of the S x S scores the attention kernel computes
    flash: bool = True              # a flash kernel; False: scores and probabilities go through HBM
    tflops_attention: float = 0.5   # MaxText's FLOP count: 0.5 x 12 H L D S^2 B (2024), 1 x (2023-10), 0 (2023-04)
    quantized: bool = False         # int8 AQT projections (forward, dlhs and drhs dots) at the int8 MXU rate
    rope: bool = True               # rotary embedding on q and k (GPT-3: learned positions instead)

    @classmethod
    def from_scale(cls, scale: int, *, base_emb: int, base_heads: int, base_mlp: int, base_layers: int = 16,
                   **rest) -> Decoder:
        """MaxText ``pyconfig.get_individual_scales`` (2023-10 and 2024-03 alike): log2(scale) = 3q + r;
        heads and mlp x 2^(q + (r > 0)), emb x 2^(q + (r > 1)), layers x 2^q."""
        log2 = int(math.log2(scale))
        if 2 ** log2 != scale:
            raise ValueError(f"global_parameter_scale {scale} is not a power of 2")
        q, r = divmod(log2, 3)
        heads_scale = q + int(r > 0)
        emb_scale = q + int(r > 1)
        return cls(emb=base_emb * 2 ** emb_scale, heads=base_heads * 2 ** heads_scale,
                   mlp=base_mlp * 2 ** heads_scale, layers=base_layers * 2 ** q, **rest)

    @property
    def qdim(self) -> int:
        return self.heads * self.head_dim

    @property
    def layer_matrix_params(self) -> int:
        """Q, K, V, O projections and the MLP matrices of one layer."""
        return 4 * self.emb * self.qdim + (self.mlp_matrices_in + 1) * self.emb * self.mlp

    @property
    def params(self) -> int:
        """MaxText's count (``calculate_num_params_from_pytree``): layers (matrices and 2 norm scales),
        the embedding, the logits matrix unless tied, the final norm."""
        layer = self.layer_matrix_params + 2 * self.emb
        return self.layers * layer + self.vocab * self.emb * (1 if self.tied_logits else 2) + self.emb

    def maxtext_tflops(self, per_device_batch: int) -> float:
        """MaxText's TFLOPs of one step per device: 6 N tokens + ``tflops_attention`` x 12 H L D S^2 B: the
        attention term halved for causality in the 2024 code (maxtext_utils.calculate_tflops_training_per_device
        at 04262f3), whole in the 2023-10 code (train.calculate_training_tflops at e47fa1b), absent in the
        2023-04 code (train.py at 281e04b: 6 N tokens only)."""
        tokens = self.seq * per_device_batch
        weights = 6 * self.params * tokens
        attention = 12 * self.heads * self.layers * self.head_dim * self.seq ** 2 * per_device_batch
        return (weights + self.tflops_attention * attention) / 1e12


@dataclass(frozen=True)
class Run:
    """One published MaxText run: model, slice, parallelism, batch, remat, and the figure."""

    name: str
    model_label: str                # "32B"
    model: Decoder
    chip: str
    accelerator: str                # Cloud accelerator type as published, e.g. "v5p-128"
    topology: str                   # the ICI slice tpusim builds, e.g. "3d:4x4x4"
    per_device_batch: int
    tensor: int                     # ici_tensor_parallelism (fsdp = the rest of the slice)
    remat: str                      # "minimal", "full", "save_dot_except_logits(_ffn1)" (module docstring)
    tflops_per_chip: float          # published TFLOP/s per chip
    mfu: str                        # published MFU, as printed
    where: str                      # README commit and table row
    config: str                     # config script and commit
    slices: int = 1
    data: int = 1                   # ici_data_parallelism (a torus axis of its own)
    step_s: float = 0.0             # a published time per step (MLPerf logs) instead of a TFLOP/s rate
    eval_steps_per_step: float = 0.0    # forward-only eval steps the published time includes, per train step
    eval_per_device_batch: int = 1
    source: str = MAXTEXT
    published_text: str = ""        # the figure as published, when it is not a TFLOP/s rate
    conversion_text: str = ""       # how that figure became seconds per step
    precision: str = "bf16 activations, f32 weights"

    def published_step_s(self) -> float:
        if self.step_s:
            return self.step_s
        return self.model.maxtext_tflops(self.per_device_batch) / self.tflops_per_chip


# --------------------------------------------------------------------------- the step trace

class _Builder:
    """Appends records of one rank's step: tensors get fresh ids (one storage each, no aliasing)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.next_id = 1
        self.program = 1

    def tensor(self, shape: tuple[int, ...], itemsize: int = BF16, dtype: str = "bfloat16") -> TensorMeta:
        tid = self.next_id
        self.next_id += 1
        return TensorMeta(id=tid, shape=tuple(int(s) for s in shape), dtype=dtype,
                          nbytes=int(math.prod(shape) * itemsize), storage=tid)

    def op(self, name: str, family: Family, inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...], *,
           flops: float, transcendentals: float = 0.0, matmul: tuple[int, int, int, int] | None = None,
           dtype: str = "bfloat16") -> None:
        self.records.append(OpRecord(
            seq=len(self.records), op=name, unit=unit_of(family), dtype=dtype, inputs=inputs, outputs=outputs,
            flops=float(flops), transcendentals=float(transcendentals),
            bytes_read=float(sum(t.nbytes for t in inputs)), bytes_written=float(sum(t.nbytes for t in outputs)),
            matmul=matmul, program=self.program, family=str(family)))

    def kernel(self, name: str, family: Family, inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...],
               work: Work, dtype: str = "bfloat16") -> None:
        """An op whose work a shared cost rule counted (tpusim/trace/cost_rules.py, as the backend counts it)."""
        self.op(name, family, inputs, outputs, flops=work.flops, transcendentals=work.transcendentals,
                matmul=work.matmul, dtype=dtype)

    def collective(self, kind: str, nbytes: float, group: tuple[int, ...], inputs: tuple[TensorMeta, ...],
                   outputs: tuple[TensorMeta, ...], source: str) -> None:
        self.records.append(CollectiveRecord(
            seq=len(self.records), collective=kind, bytes=int(nbytes), group=group, inputs=inputs,
            outputs=outputs, dtype="bfloat16", async_op=True, source=source))


@dataclass
class _Groups:
    tensor: tuple[int, ...]
    fsdp: tuple[int, ...]
    dcn: tuple[int, ...]
    data: tuple[int, ...] = (0,)


def mesh_groups(topology: str, chip: ChipSpec, tensor: int, slices: int, data: int = 1) -> _Groups:
    """Rank 0's tensor, data, fsdp and DCN groups: tensor = one torus axis of length ``tensor`` (the
    first such axis), data = the next axis of length ``data`` (ici_data_parallelism), fsdp = the other
    axes of slice 0, DCN = rank 0's position in every slice."""
    slice_ = build_slice(topology, chip=chip)
    dims = slice_.dims
    if tensor == 1:
        t_axis = None
    else:
        t_axis = next((i for i, n in enumerate(dims) if n == tensor), None)
        if t_axis is None:
            raise ValueError(f"no axis of {topology} has length {tensor} for tensor parallelism")
    d_axis = None
    if data > 1:
        d_axis = next((i for i, n in enumerate(dims) if n == data and i != t_axis), None)
        if d_axis is None:
            raise ValueError(f"no axis of {topology} besides the tensor axis has length {data} for data parallelism")
    strides = [math.prod(dims[:i]) for i in range(len(dims))]

    def line(axes: list[int]) -> tuple[int, ...]:
        ranks = [0]
        for a in axes:
            ranks = [r + k * strides[a] for k in range(dims[a]) for r in ranks]
        return tuple(sorted(ranks))

    others = [i for i in range(len(dims)) if i not in (t_axis, d_axis) and dims[i] > 1]
    per_slice = math.prod(dims)
    return _Groups(tensor=line([t_axis]) if t_axis is not None else (0,), fsdp=line(others),
                   dcn=tuple(s * per_slice for s in range(slices)),
                   data=line([d_axis]) if d_axis is not None else (0,))


PROJECTIONS = ("qkv_proj", "out_proj", "mlp_wi", "mlp_wo")     # the dots int8 AQT quantizes (not logits, embedding)


def step_trace(run: Run, chip: ChipSpec, steps: int = 2, train: bool = True) -> Trace:
    """``steps`` training steps of ``run`` as rank 0 records them (module docstring: modelling choices);
    ``train=False``: forward-only eval steps at ``run.eval_per_device_batch``."""
    model, T, S = run.model, run.tensor, run.model.seq
    groups = mesh_groups(run.topology, chip, T, run.slices, run.data)
    F = len(groups.fsdp)
    world = F * T * len(groups.data) * run.slices
    B = (run.per_device_batch if train else run.eval_per_device_batch) * T   # sequences a tensor group works on
    m = B * S                                 # tokens in every matmul
    E, Q, Fm, V = model.emb, model.qdim // T, model.mlp // T, model.vocab // T
    H = model.heads // T
    qkv = 3 * Q
    wi = model.mlp_matrices_in * Fm
    b = _Builder()
    dw_pending: list[tuple] = []

    def ag(x: TensorMeta, group: tuple[int, ...], out_shape: tuple[int, ...], what: str) -> TensorMeta:
        """All-gather ``x`` over ``group`` (identity for a group of one)."""
        if len(group) == 1:
            return x
        out = b.tensor(out_shape, x.nbytes // max(1, math.prod(x.shape)))
        b.collective("all_gather", x.nbytes, group, (x,), (out,), what)
        return out

    def rs(x: TensorMeta, group: tuple[int, ...], out_shape: tuple[int, ...], what: str) -> TensorMeta:
        if len(group) == 1:
            return x
        out = b.tensor(out_shape)
        b.collective("reduce_scatter", x.nbytes, group, (x,), (out,), what)
        return out

    def tp_ag(x: TensorMeta, what: str) -> TensorMeta:
        out = ag(x, groups.tensor, (m, E), what)
        flush_dw()
        return out

    def tp_rs(x: TensorMeta, what: str) -> TensorMeta:
        out = rs(x, groups.tensor, (B, S, E // T), what)
        flush_dw()
        return out

    def mm(name: str, x: TensorMeta, w: TensorMeta, mkn: tuple[int, int, int], out_item: int = BF16) -> TensorMeta:
        mm_m, mm_k, mm_n = mkn
        out = b.tensor((mm_m, mm_n), out_item)
        int8 = model.quantized and any(p in name for p in PROJECTIONS)
        b.kernel(name, Family.CONTRACTION, (x, w), (out,), gemm(1, mm_m, mm_k, mm_n), "int8" if int8 else "bfloat16")
        return out

    def rope(name: str, x: TensorMeta) -> TensorMeta:
        return elementwise(name, (x,), (m, qkv), 2.0) if model.rope else x

    def dw(name: str, x: TensorMeta, d: TensorMeta, mkn: tuple[int, int, int]) -> None:
        """A weight-gradient matmul, placed after the next collective it can hide (module docstring)."""
        dw_pending.append((name, x, d, mkn))

    def flush_dw() -> None:
        while dw_pending:
            name, x, d, mkn = dw_pending.pop(0)
            mm(name, x, d, mkn)

    def elementwise(name: str, inputs: tuple[TensorMeta, ...], shape: tuple[int, ...], flops_per: float,
                    trans_per: float = 0.0, family: Family = Family.ELEMENTWISE, itemsize: int = BF16) -> TensorMeta:
        out = b.tensor(shape, itemsize)
        n = math.prod(shape)
        b.op(name, family, inputs, (out,), flops=flops_per * n, transcendentals=trans_per * n)
        return out

    def attention(name: str, inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...], backward: bool) -> None:
        """Flash attention over B sequences x H local heads computing ``attention_kept`` of the scores
        (the rule tpusim's backend prices scaled_dot_product_attention with, tpusim/trace/cost_rules.py)."""
        D = model.head_dim
        b.kernel(name, Family.ATTENTION, inputs, outputs,
                 flash_attention(B * H, S, S, D, D, backward=backward, kept=model.attention_kept))

    def attention_forward(tag: str, qkv_r: TensorMeta) -> dict[str, TensorMeta]:
        """Attention forward: one flash kernel, or (``flash=False``) scores, softmax and values through HBM."""
        o = b.tensor((m, Q))
        if model.flash:
            lse = b.tensor((B, H, S), F32, "float32")
            attention(f"{tag}flash_attention", (qkv_r,), (o, lse), backward=False)
            return {"o": o, "lse": lse}
        D = model.head_dim
        scores = mm_batched(f"{tag}attention_scores", (qkv_r,), (B * H, S, D, S))
        p = elementwise(f"{tag}softmax", (scores,), (B * H, S, S), 5.0, 1.0, Family.REDUCTION)
        b.kernel(f"{tag}attention_values", Family.CONTRACTION, (p, qkv_r), (o,), gemm(B * H, S, S, D))
        return {"o": o, "p": p}

    def attention_backward(r: dict[str, TensorMeta], d_o: TensorMeta) -> TensorMeta:
        if model.flash:
            d_qkv_r = b.tensor((m, qkv))
            attention("bwd:flash_attention", (r["qkv_r"], r["o"], r["lse"], d_o), (d_qkv_r,), backward=True)
            return d_qkv_r
        D = model.head_dim
        d_p = mm_batched("bwd:attention_dp", (d_o, r["qkv_r"]), (B * H, S, D, S))
        d_v = mm_batched("bwd:attention_dv", (r["p"], d_o), (B * H, S, S, D))
        d_s = elementwise("bwd:softmax", (r["p"], d_p), (B * H, S, S), 4.0, 0.0, Family.REDUCTION)
        d_q = mm_batched("bwd:attention_dq", (d_s, r["qkv_r"]), (B * H, S, S, D))
        d_k = mm_batched("bwd:attention_dk", (d_s, r["qkv_r"]), (B * H, S, S, D))
        return elementwise("bwd:attention_grads", (d_q, d_k, d_v), (m, qkv), 0.0)

    def mm_batched(name: str, inputs: tuple[TensorMeta, ...], bmkn: tuple[int, int, int, int]) -> TensorMeta:
        batch, mm_m, mm_k, mm_n = bmkn
        out = b.tensor((batch, mm_m, mm_n))
        b.kernel(name, Family.CONTRACTION, inputs, (out,), gemm(batch, mm_m, mm_k, mm_n))
        return out

    def weights_gather(what: str) -> dict[str, TensorMeta]:
        """One layer's weights, all-gathered over fsdp in one collective (XLA combines them)."""
        shard = b.tensor((model.layer_matrix_params // (T * F),))
        full = ag(shard, groups.fsdp, (model.layer_matrix_params // T,), what)
        return {"w": full}

    def layer_forward(x: TensorMeta, w: TensorMeta, tag: str) -> dict[str, TensorMeta]:
        act = (B, S, E // T)
        ln1 = elementwise(f"{tag}rmsnorm", (x,), act, 4.0, 1.0 / E, Family.REDUCTION)
        ln1g = tp_ag(ln1, f"{tag}tp all-gather (attention input)")
        qkv_out = mm(f"{tag}qkv_proj", ln1g, w, (m, E, qkv))
        qkv_r = rope(f"{tag}rope", qkv_out)
        att = attention_forward(tag, qkv_r)
        attn_p = mm(f"{tag}out_proj", att["o"], w, (m, Q, E))
        attn = tp_rs(attn_p, f"{tag}tp reduce-scatter (attention output)")
        h1 = elementwise(f"{tag}residual_rmsnorm", (x, attn), act, 5.0, 1.0 / E, Family.REDUCTION)
        ln2 = elementwise(f"{tag}rmsnorm_out", (h1,), act, 1.0)
        ln2g = tp_ag(ln2, f"{tag}tp all-gather (mlp input)")
        g = mm(f"{tag}mlp_wi", ln2g, w, (m, E, wi))
        a = elementwise(f"{tag}activation", (g,), (m, Fm), 5.0, 1.0)
        mlp_p = mm(f"{tag}mlp_wo", a, w, (m, Fm, E))
        mlp = tp_rs(mlp_p, f"{tag}tp reduce-scatter (mlp output)")
        out = elementwise(f"{tag}residual", (h1, mlp), act, 1.0)
        return {"x": x, "ln1g": ln1g, "qkv": qkv_out, "qkv_r": qkv_r, **att, "attn": attn, "h1": h1,
                "ln2g": ln2g, "g": g, "a": a, "out": out}

    def layer_recompute(x: TensorMeta, w: TensorMeta, saved: dict[str, TensorMeta]) -> dict[str, TensorMeta]:
        """Backward's recompute of the forward (module docstring, Remat)."""
        if run.remat == "full":
            return layer_forward(x, w, "remat:")
        act = (B, S, E // T)
        ln1 = elementwise("remat:rmsnorm", (x,), act, 4.0, 1.0 / E, Family.REDUCTION)
        ln1g = tp_ag(ln1, "remat: tp all-gather (attention input)")
        qkv_r = rope("remat:rope", saved["qkv"])
        att = attention_forward("remat:", qkv_r)
        h1 = elementwise("remat:residual_rmsnorm", (x, saved["attn"]), act, 5.0, 1.0 / E, Family.REDUCTION)
        ln2 = elementwise("remat:rmsnorm_out", (h1,), act, 1.0)
        ln2g = tp_ag(ln2, "remat: tp all-gather (mlp input)")
        # save_dot_except_logits_ffn1 saves the projections but not the MLP's first dot: recompute it
        g = mm("remat:mlp_wi", ln2g, w, (m, E, wi)) if run.remat == "save_dot_except_logits_ffn1" else saved["g"]
        a = elementwise("remat:activation", (g,), (m, Fm), 5.0, 1.0)
        return {"x": x, "ln1g": ln1g, "qkv_r": qkv_r, **att, "h1": h1, "ln2g": ln2g, "g": g, "a": a}

    def layer_backward(d_out: TensorMeta, w: TensorMeta, r: dict[str, TensorMeta]) -> TensorMeta:
        act = (B, S, E // T)
        d_mlp = tp_ag(d_out, "bwd: tp all-gather (mlp output grad)")
        d_a = mm("bwd:mlp_wo_dx", d_mlp, w, (m, E, Fm))
        dw("bwd:mlp_wo_dw", r["a"], d_mlp, (Fm, m, E))
        d_g = elementwise("bwd:activation", (d_a, r["g"]), (m, wi), 6.0, 1.0)
        d_ln2p = mm("bwd:mlp_wi_dx", d_g, w, (m, wi, E))
        dw("bwd:mlp_wi_dw", r["ln2g"], d_g, (E, m, wi))
        d_ln2 = tp_rs(d_ln2p, "bwd: tp reduce-scatter (mlp input grad)")
        d_h1 = elementwise("bwd:rmsnorm_residual", (d_ln2, r["h1"], d_out), act, 8.0, 0.0, Family.REDUCTION)
        d_attn = tp_ag(d_h1, "bwd: tp all-gather (attention output grad)")
        d_o = mm("bwd:out_proj_dx", d_attn, w, (m, E, Q))
        dw("bwd:out_proj_dw", r["o"], d_attn, (Q, m, E))
        d_qkv_r = attention_backward(r, d_o)
        d_qkv = rope("bwd:rope", d_qkv_r)
        d_ln1p = mm("bwd:qkv_proj_dx", d_qkv, w, (m, qkv, E))
        dw("bwd:qkv_proj_dw", r["ln1g"], d_qkv, (E, m, qkv))
        d_ln1 = tp_rs(d_ln1p, "bwd: tp reduce-scatter (attention input grad)")
        return elementwise("bwd:rmsnorm_residual_in", (d_ln1, r["x"], d_h1), act, 8.0, 0.0, Family.REDUCTION)

    def gradient_reduce(size: int, what: str) -> None:
        """Reduce-scatter a weight gradient over fsdp, then all-reduce its shard over the data axis (ICI) and
        over DCN (several slices)."""
        flush_dw()
        grad = b.tensor((size,))
        shard = rs(grad, groups.fsdp, (size // F,), f"{what}: fsdp reduce-scatter")
        if len(groups.data) > 1:
            reduced = b.tensor((size // F,))
            b.collective("all_reduce", shard.nbytes, groups.data, (shard,), (reduced,), f"{what}: data all-reduce")
            shard = reduced
        if len(groups.dcn) > 1:
            out = b.tensor((size // F,))
            b.collective("all_reduce", shard.nbytes, groups.dcn, (shard,), (out,), f"{what}: dcn all-reduce")

    for step in range(steps):
        b.program = step + 1
        # ---- embedding: one-hot (iota) matmul against the gathered table, reduce-scattered over tensor
        table = ag(b.tensor((V * E // F,)), groups.fsdp, (V, E), "embedding: fsdp all-gather")
        onehot = b.tensor((m, V))
        x_p = mm("embed_onehot", onehot, table, (m, V, E))
        x = rs(x_p, groups.tensor, (B, S, E // T), "embedding: tp reduce-scatter")
        # ---- layers forward, weights gathered one layer ahead
        gathered = [weights_gather("layer 0: fsdp all-gather")]
        saved = []
        for layer in range(model.layers):
            if layer + 1 < model.layers:
                gathered.append(weights_gather(f"layer {layer + 1}: fsdp all-gather"))
            fwd = layer_forward(x, gathered[layer]["w"], "")
            saved.append(fwd)
            x = fwd["out"]
        # ---- logits and loss
        logits_w = table if model.tied_logits else ag(b.tensor((V * E // F,)), groups.fsdp, (E, V),
                                                     "logits: fsdp all-gather")
        lnf = elementwise("final_rmsnorm", (x,), (B, S, E // T), 4.0, 1.0 / E, Family.REDUCTION)
        lnfg = tp_ag(lnf, "logits: tp all-gather")
        logits = mm("logits", lnfg, logits_w, (m, E, V), out_item=F32)
        loss_grad = elementwise("softmax_cross_entropy", (logits,), (m, V), 6.0, 1.0, Family.REDUCTION, F32)
        if not train:                         # an eval step: the loss, no backward pass, no update
            b.records.append(StepMarker(seq=len(b.records), step=step))
            continue
        d_lnfg = mm("bwd:logits_dx", loss_grad, logits_w, (m, V, E))
        dw("bwd:logits_dw", lnfg, loss_grad, (E, m, V))
        d_lnf = tp_rs(d_lnfg, "bwd: tp reduce-scatter (logits input grad)")
        if not model.tied_logits:
            gradient_reduce(V * E, "logits")
        d = elementwise("bwd:final_rmsnorm", (d_lnf, x), (B, S, E // T), 8.0, 0.0, Family.REDUCTION)
        # ---- layers backward, weights gathered again one layer ahead
        regathered = {model.layers - 1: weights_gather(f"bwd layer {model.layers - 1}: fsdp all-gather")}
        for layer in reversed(range(model.layers)):
            if layer > 0:
                regathered[layer - 1] = weights_gather(f"bwd layer {layer - 1}: fsdp all-gather")
            w = regathered.pop(layer)["w"]
            r = layer_recompute(saved[layer]["x"], w, saved[layer])
            d = layer_backward(d, w, r)
            gradient_reduce(model.layer_matrix_params // T, f"layer {layer} grads")
        # ---- embedding backward: one-hot^T x gathered grad
        dg = tp_ag(d, "bwd: tp all-gather (embedding grad)")
        dw("bwd:embed_dw", onehot, dg, (V, m, E))
        gradient_reduce(V * E, "embedding")
        # ---- optimizer: global-norm clipping and AdamW on the f32 shard of every parameter
        local = model.params // (F * T)
        grads = b.tensor((local,))
        elementwise("grad_global_norm", (grads,), (1,), 0.0, 0.0, Family.REDUCTION, F32)
        b.records[-1] = replace(b.records[-1], flops=2.0 * local)
        state = b.tensor((local, 3), F32, "float32")
        b.op("adamw", Family.ELEMENTWISE, (grads, state), (b.tensor((local, 3), F32, "float32"),),
             flops=12.0 * local, transcendentals=local, dtype="float32")
        b.records.append(StepMarker(seq=len(b.records), step=step))
    return Trace(records=tuple(b.records), world_size=world, rank=0)


# --------------------------------------------------------------------------- pricing and breakdown

def breakdown(timeline: Timeline, start_s: float, end_s: float) -> dict[str, float]:
    """Where one step's time went on the simulated chip: op time by what bound it, waits for
    collectives, and the rest (device idle: host, dependencies)."""
    chip = timeline.chips_simulated[0]
    parts = {"compute (mxu)": 0.0, "compute (vpu, transcendental)": 0.0, "memory (hbm)": 0.0, "launch": 0.0,
             "exposed collectives": 0.0}
    busy = 0.0
    for e in timeline.events:
        if e.chip != chip or e.track != "tensorcore" or e.end_s <= start_s or e.start_s >= end_s:
            continue
        seconds = min(e.end_s, end_s) - max(e.start_s, start_s)
        if e.kind == "op":
            key = {"mxu": "compute (mxu)", "vpu": "compute (vpu, transcendental)",
                   "transcendental": "compute (vpu, transcendental)", "hbm": "memory (hbm)",
                   "launch": "launch"}.get(e.bound, "compute (vpu, transcendental)")
        elif e.kind == "wait" and e.bound == "collective":
            key = "exposed collectives"
        else:
            continue
        parts[key] += seconds
        busy += seconds
    parts["host / idle"] = max(0.0, (end_s - start_s) - busy)
    return parts


def predictor(run: Run):
    """A case's predictor: price two steps of ``run`` on the chip it is given, return the second."""

    def predict(chip: ChipSpec) -> Prediction:
        slice_ = build_slice(run.topology, chip=chip, slices=run.slices)
        trace = step_trace(run, chip)
        timeline = price(trace, topology=slice_, mode=FUSED)
        step = timeline.steps[-1]
        parts = breakdown(timeline, step.start_s, step.end_s)
        seconds = step.seconds
        model = run.model
        flops = model.maxtext_tflops(run.per_device_batch) * 1e12
        fsdp = slice_.num_chips // (run.tensor * run.data)
        notes = [f"{run.model_label}: emb {model.emb}, {model.heads} heads x {model.head_dim}, mlp {model.mlp}, "
                 f"{model.layers} layers, vocab {model.vocab}; {model.params / 1e9:.2f}B parameters"
                 + ("; int8 AQT projections" if model.quantized else ""),
                 f"{run.accelerator} = {slice_.spec}" + (f" x {run.slices} slices over DCN" if run.slices > 1 else "")
                 + (f"; data {run.data}" if run.data > 1 else "")
                 + f"; fsdp {fsdp} x tensor {run.tensor}; per-device batch "
                 f"{run.per_device_batch} x {model.seq} tokens; remat {run.remat}",
                 f"priced: {sum(isinstance(r, OpRecord) for r in trace.records) // 2} ops and "
                 f"{sum(isinstance(r, CollectiveRecord) for r in trace.records) // 2} collectives per step, fused "
                 f"mode; second of two steps",
                 f"predicted MFU {flops / step.seconds / chip.peak_bf16_flops_per_s:.1%} of the bf16 peak "
                 f"({flops / step.seconds / 1e12:.1f} TFLOP/s/chip by MaxText's count, training step alone)"]
        if run.eval_steps_per_step:
            # the published time per step includes the eval passes run between training blocks
            evals = price(step_trace(run, chip, train=False), topology=slice_, mode=FUSED).steps[-1].seconds
            parts[f"eval forward passes ({run.eval_steps_per_step:g} per step)"] = run.eval_steps_per_step * evals
            seconds += run.eval_steps_per_step * evals
            notes.append(f"training step {step.seconds:.3f} s + {run.eval_steps_per_step:g} x eval step {evals:.3f} s "
                         f"(forward only, per-device batch {run.eval_per_device_batch})")
        return Prediction(seconds, parts, tuple(notes))

    return predict


def case(run: Run, *, slow: bool) -> Case:
    setup = (f"{run.model_label} ({run.model.params / 1e9:.1f}B params), "
             + (f"data {run.data} x " if run.data > 1 else "") + f"fsdp x tensor {run.tensor}"
             + (f", DCN data parallel x {run.slices}" if run.slices > 1 else "")
             + f"; per-device batch {run.per_device_batch} x seq {run.model.seq}; {run.precision}; "
             f"remat {run.remat}; flash attention")
    where = "MLPerf" if run.step_s else "MaxText"
    return Case(
        name=run.name, kind="measured",
        title=f"{where} {run.model_label} training step on {run.slices} x {run.accelerator}"
        if run.slices > 1 else f"{where} {run.model_label} training step on {run.accelerator}",
        chip=run.chip, slice=run.topology + (f" x {run.slices} slices over DCN" if run.slices > 1 else ""),
        setup=setup, published=run.published_text or f"{run.tflops_per_chip:g} TFLOP/s/chip ({run.mfu} MFU)",
        published_s=run.published_step_s(),
        conversion=run.conversion_text or f"step = MaxText's TFLOPs per device per step "
                   f"({run.model.maxtext_tflops(run.per_device_batch):.1f}) / {run.tflops_per_chip:g} TFLOP/s",
        source=run.source, where=f"{run.where}; config {run.config}", predict=predictor(run),
        model="closed-form decoder step (tpusim/validate/maxtext.py docstring), fused mode", slow=slow,
        twin=f"product-{run.name}" if has_product_twin(run) else "")


# the multislice rows up to this many slices are product cases too (the 8- to 32-slice rows stay closed-form
# only: each product case records and prices a whole run, minutes apiece)
MULTISLICE_PRODUCT_UP_TO = 4


def has_product_twin(run: Run) -> bool:
    """Whether the product path (tpusim/validate/product.py) prices this row too, as the script through `tpusim run`:
    flash-attention rows of FSDP x tensor parallel (no ICI data parallel axis), published as a rate."""
    return run.slices <= MULTISLICE_PRODUCT_UP_TO and run.data == 1 and not run.step_s and run.model.flash


# --------------------------------------------------------------------------- the published rows

# 2024-03 (README commit 04262f3, "README updates": the v5p table): base.yml llama2 defaults
V5P_2024 = dict(base_emb=2048, base_heads=16, base_mlp=7168, head_dim=128, vocab=32000, mlp_matrices_in=2,
                tied_logits=False, attention_kept=10 / 16, tflops_attention=0.5)
# 2023-10 (README commit e47fa1b, "Modify results table": the v5e table): base.yml defaults then
V5E_2023 = dict(base_emb=2560, base_heads=8, base_mlp=8192, head_dim=256, vocab=32768, mlp_matrices_in=1,
                tied_logits=True, attention_kept=1.0, tflops_attention=1.0)

# 2023-04 (README commit 281e04b, "Update readme with new perf results": the v4 tables): base.yml then, sizes
# given by a multiplicative `scale` (22B: scale=3; 52B: scale=4 on base emb 3072, mlp 12288, 8 layers)
V4_2023 = dict(head_dim=256, vocab=32768, mlp_matrices_in=1, tied_logits=True, seq=1024, attention_kept=1.0,
               flash=False, tflops_attention=0.0)

_V4_WHERE = "MaxText README @ 281e04b (2023-04-27), 'Runtime Performance Results'"
_V5P_WHERE = "MaxText README @ 04262f3 (2024-03-22), 'Runtime Performance Results', TPU v5p table"
_V5E_WHERE = "MaxText README @ e47fa1b (2023-10-31), 'Runtime Performance Results', v5e tables"


def _v5p(label: str, scale: int, accelerator: str, topology: str, pdb: int, tensor: int, remat: str,
         tflops: float, mfu: str, config: str) -> Run:
    return Run(name=f"maxtext-v5p-{label.lower()}-{accelerator}", model_label=label,
               model=Decoder.from_scale(scale, **V5P_2024), chip="v5p", accelerator=accelerator, topology=topology,
               per_device_batch=pdb, tensor=tensor, remat=remat, tflops_per_chip=tflops, mfu=mfu,
               where=f"{_V5P_WHERE}, row {label} {accelerator}",
               config=f"MaxText/configs/v5p/{config} @ 04262f3")


def _v5e(label: str, scale: int, slices: int, pdb: int, tflops: float, mfu: str) -> Run:
    accelerator = "v5e-256"
    return Run(name=f"maxtext-v5e-{label.lower()}-{slices}x{accelerator}", model_label=label,
               model=Decoder.from_scale(scale, **V5E_2023), chip="v5e", accelerator=accelerator,
               topology="2d:16x16", per_device_batch=pdb, tensor=1, remat="full", tflops_per_chip=tflops, mfu=mfu,
               where=f"{_V5E_WHERE}, {label} row {slices}x v5e-256", slices=slices,
               config=f"MaxText/configs/largest_job/{label.lower()}.sh @ e47fa1b")


def _v4(label: str, model: Decoder, accelerator: str, topology: str, slices: int, pdb: int, tflops: float,
        mfu: str, config: str) -> Run:
    return Run(name=f"maxtext-v4-{label.lower()}-{slices}x{accelerator}", model_label=label, model=model,
               chip="v4", accelerator=accelerator, topology=topology, per_device_batch=pdb, tensor=1, remat="full",
               tflops_per_chip=tflops, mfu=mfu, where=f"{_V4_WHERE}, {label} table row {slices}x {accelerator}",
               slices=slices, config=f"MaxText/configs/{config} @ 281e04b")


V4_22B = Decoder(emb=3 * 2048, heads=3 * 8, mlp=3 * 8192, layers=3 * 16, **V4_2023)
V4_52B = Decoder(emb=4 * 3072, heads=4 * 8, mlp=4 * 12288, layers=4 * 8, **V4_2023)

RUNS: tuple[Run, ...] = (
    _v5p("32B", 32, "v5p-128", "3d:4x4x4", 6, 4, "minimal", 328, "71.47%", "32b.sh"),
    _v5p("64B", 64, "v5p-128", "3d:4x4x4", 3, 4, "minimal", 323, "70.31%", "64b.sh"),
    _v5p("128B", 128, "v5p-256", "3d:4x4x8", 1, 8, "minimal", 315, "68.68%", "128b.sh"),
    _v5p("128B", 128, "v5p-512", "3d:4x8x8", 1, 8, "minimal", 315, "68.53%", "128b.sh"),
    _v5p("256B", 256, "v5p-1024", "3d:8x8x8", 1, 8, "minimal", 316, "68.82%", "256b.sh"),
    _v5p("512B", 512, "v5p-1024", "3d:8x8x8", 2, 8, "full", 294, "63.99%", "512b.sh"),
    _v5p("1024B", 1024, "v5p-4096", "3d:8x16x16", 2, 16, "full", 297, "64.80%", "1024b.sh"),
    *(_v5e("16B", 16, n, 6, t, mfu) for n, t, mfu in
      ((1, 120, "61.10%"), (2, 117, "59.37%"), (4, 117, "59.14%"), (8, 115, "58.27%"), (16, 111, "56.56%"),
       (32, 108, "54.65%"))),
    *(_v5e("32B", 32, n, 4, t, mfu) for n, t, mfu in
      ((1, 132, "66.86%"), (2, 128, "64.81%"), (4, 126, "64.10%"), (8, 125, "63.67%"), (16, 123, "62.26%"),
       (32, 119, "60.40%"))),
    *(_v5e("64B", 64, n, 2, t, mfu) for n, t, mfu in
      ((1, 118, "59.90%"), (2, 112, "56.66%"), (4, 110, "55.85%"), (8, 108, "54.96%"), (16, 105, "53.29%"),
       (32, 99, "50.18%"))),
    *(_v4("22B", V4_22B, "v4-128", "3d:4x4x4", n, 16, t, mfu, config) for n, t, mfu, config in
      ((1, 156, "56.7%", "1xv4-128.sh"), (2, 152, "55.2%", "2xv4-128.sh"), (4, 149, "54.3%", "4xv4-128.sh"),
       (8, 146, "53.2%", "4xv4-128.sh with 8 slices (no 8x script at that commit)"))),
    *(_v4("52B", V4_52B, "v4-384", "3d:4x4x12", n, 10, t, mfu, config) for n, t, mfu, config in
      ((1, 154, "56.0%", "1xv4-384.sh"), (2, 162, "58.9%", "2xv4-384.sh"))),
)

# MLPerf Training v4.0, Google's closed GPT-3 175B submissions (MaxText @ f586e43, model gpt3-175b.yml:
# emb 12288, 96 heads x 128, mlp 49152 gelu, 96 layers, vocab 50304 tied, learned positions; int8 AQT on
# every projection dot, forward and both backward dots, quantization_local_shard_count -1). The published
# figure is the MLLOG: block_start/block_stop every 24576 sequences (12 steps at GBS 2048, 8 at 3072), and
# each block includes the eval of 24567 sequences at eval_per_device_batch 1 (no eval_start/stop events
# split them), so the case prices the training step plus the eval forward steps a block holds, per step.
# The 512-chip (v5p-1024, one 8x8x8 slice) submission is held out for good and is not a case.
GPT3_175B = Decoder(emb=12288, heads=96, head_dim=128, mlp=49152, layers=96, vocab=50304, mlp_matrices_in=1,
                    tied_logits=True, seq=2048, attention_kept=10 / 16, tflops_attention=0.5, quantized=True,
                    rope=False)
MLPERF_V40 = "https://github.com/mlcommons/training_results_v4.0"


def _mlperf_gpt3(accelerator: str, topology: str, chips: int, gbs: int, data: int, fsdp: int, step_s: float,
                 ttt: str, remat: str = "save_dot_except_logits_ffn1") -> Run:
    steps_per_block = 24576 // gbs
    eval_steps = math.ceil(24567 / chips)            # eval_per_device_batch 1: one sequence per chip per step
    return Run(
        name=f"mlperf-v4.0-gpt3-175b-{accelerator}", model_label="GPT-3 175B", model=GPT3_175B, chip="v5p",
        accelerator=accelerator, topology=topology, per_device_batch=gbs // chips, tensor=8, data=data,
        remat=remat, tflops_per_chip=0.0, mfu="",
        where=f"Google/results/cloud-tpu-{accelerator}-maxtext/gpt3/result_*.txt (MLLOG block_stop intervals; "
              f"{ttt})",
        config=f"Google/benchmarks/gpt3/implementations/maxtext/{accelerator}.sh (ici_data_parallelism={data} "
               f"ici_fsdp_parallelism={fsdp} ici_tensor_parallelism=8, per_device_batch_size={gbs // chips}, "
               f"remat_policy={remat}, attention=flash, quantization=int8; MaxText f586e43)",
        step_s=step_s, eval_steps_per_step=eval_steps / steps_per_block, source=MLPERF_V40,
        published_text=f"{step_s:g} s per training step, eval included (median block time / {steps_per_block} "
                       f"steps)",
        conversion_text=f"a block of {steps_per_block} steps (24576 sequences at GBS {gbs}) and {eval_steps} eval "
                        f"steps (24567 sequences, 1 per chip) per {steps_per_block} steps",
        precision="int8 AQT projections, bf16 activations, f32 weights")


MLPERF_RUNS: tuple[Run, ...] = (
    _mlperf_gpt3("v5p-2048", "3d:8x8x16", 1024, 2048, 8, 16, 11.81, "TTT about 57 min"),
    _mlperf_gpt3("v5p-3072", "3d:8x12x16", 1536, 3072, 12, 16, 11.95, "TTT 38.5-39.4 min"),
    _mlperf_gpt3("v5p-12288", "3d:8x16x48", 6144, 6144, 16, 48, 5.97, "TTT 12.17-12.49 min",
                 remat="save_dot_except_logits"),
)
RUNS = RUNS + MLPERF_RUNS

FAST_RUNS = frozenset({"maxtext-v5p-32b-v5p-128"})
CASES: tuple[Case, ...] = tuple(case(run, slow=run.name not in FAST_RUNS) for run in RUNS)
__all__ = ["CASES", "RUNS", "Decoder", "Run", "breakdown", "step_trace"]
