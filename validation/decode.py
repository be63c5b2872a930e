"""A decoder-only LLM serving one batch: a prefill, then a static-KV-cache decode loop (tpusim validate's inference
script).

What a PyTorch user writes to serve an LLM on TPUs: the weights built on the meta device, tensor parallel by hand
over the slice's chips (each chip holds heads/tp attention heads, mlp_dim/tp of the MLP, and vocab/tp rows of the
embedding table and of the output projection; the row-parallel projections' partial sums and the embedding's rows
all-reduced and the logits all-gathered with functional collectives, so each step stays one compiled program), a
KV cache preallocated for context + steps tokens, the prefill and the decode step each ``torch.compile``'d, greedy
tokens. Each phase is marked with
``tpusim.backend.phase``, so the report and ``tpusim validate`` read TTFT and the time per output token by one rule.

``--int8``: every projection's weights in int8 with a scale per output channel, the activations quantised per row,
int8 x int8 matmuls (``torch._int_mm``), as int8 serving stacks run (weights and activations in int8).
``--kv-int8``: the cache in int8 with a scale per token and head, dequantised as the decode step's attention reads it
(written as two matmuls, which the compiler fuses the dequantize into: ``grouped_attention``).
``--chunk N``: each decode step also carries N prompt tokens of an arriving request through the same weights (the
chunked prefill a serving engine such as vLLM mixes into its decode steps).

    python -m tpusim run validation/decode.py --topology 2d:4x2 --chip v5e --numerics off -- \\
        --layers 80 --d-model 8192 --heads 64 --kv-heads 8 --mlp-dim 28672 --vocab 128256 \\
        --batch 32 --context 8192 --int8 --kv-int8
    python validation/decode.py --device cpu     # the same tokens on the CPU (small default sizes)

``tpusim validate`` runs it with ``--numerics off`` (shapes only: no host memory for a 70B model) through
``tpusim run``'s own pipeline, one case per published configuration (tpusim/validate/inference.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn import functional as F


class Projection(nn.Module):
    """One chip's shard of a bias-free projection: bf16 weights, or int8 weights with a scale per output channel
    (then the activations are quantised per row and the matmul runs int8 x int8)."""

    def __init__(self, d_in: int, d_out: int, int8: bool) -> None:
        super().__init__()
        self.int8 = int8
        self.weight = nn.Parameter(torch.empty(d_out, d_in, dtype=torch.int8 if int8 else torch.bfloat16),
                                   requires_grad=False)
        self.scale = nn.Parameter(torch.empty(d_out, dtype=torch.bfloat16), requires_grad=False) if int8 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.int8:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, x.shape[-1])
        row_scale = rows.abs().amax(1, keepdim=True).clamp(min=1e-6) / 127
        quantised = (rows / row_scale).round().clamp(-127, 127).to(torch.int8)
        out = torch._int_mm(quantised, self.weight.t()).to(x.dtype) * row_scale * self.scale
        return out.reshape(*x.shape[:-1], -1)


class Parallel:
    """The tensor-parallel group: all-reduce of partial sums and all-gather of the vocabulary shards (no-ops alone)."""

    def __init__(self, group: dist.ProcessGroup | None, size: int) -> None:
        self.group, self.size = group, size
        self.rank = dist.get_rank(group) if group is not None else 0

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", self.group) if self.size > 1 else x

    def embed(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The rows of ``tokens`` from a table sharded over the vocabulary (this chip holds ``table.shape[0]`` rows
        from rank x that): each chip looks up the tokens it holds, zeros the rest, and the all-reduce sums them."""
        if self.size == 1:
            return F.embedding(tokens, table)
        local = tokens - self.rank * table.shape[0]
        held = (local >= 0) & (local < table.shape[0])
        rows = F.embedding(local.clamp(0, table.shape[0] - 1), table) * held[..., None]
        return self.reduce(rows)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[batch, vocab/tp] on each chip -> [batch, vocab]."""
        if self.size == 1:
            return logits
        stacked = funcol.all_gather_tensor(logits, 0, self.group)           # [tp x batch, vocab/tp]
        return stacked.view(self.size, *logits.shape).permute(1, 0, 2).reshape(logits.shape[0], -1)


def rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 500000.0) -> torch.Tensor:
    """Rotary position embedding of [batch, heads, len, head_dim] at ``positions`` (the rotate-half form)."""
    dim = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv[None]
    cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
    half = torch.cat((-x[..., dim // 2:], x[..., : dim // 2]), dim=-1)
    return x * cos + half * sin


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Decode attention written as two matmuls over the cache, a K/V head's query heads stacked as rows (how
    JetStream-PyTorch reads an int8 cache): the compiler fuses the cache's dequantize into them, so each step reads
    the cache's int8 bytes once; a flash kernel would take a dequantised bf16 copy (three times the bytes)."""
    batch, heads, length, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads * length, dim)
    scores = (grouped @ keys.transpose(-1, -2)).float() / dim ** 0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(values.dtype)
    return (weights @ values).reshape(batch, heads, length, dim)


class KVCache(nn.Module):
    """One layer's keys and values for ``batch`` sequences of up to ``length`` tokens, this chip's heads."""

    def __init__(self, batch: int, heads: int, length: int, head_dim: int, int8: bool) -> None:
        super().__init__()
        shape, self.int8 = (batch, heads, length, head_dim), int8
        for name in ("k", "v"):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.int8 if int8 else torch.bfloat16))
            if int8:
                self.register_buffer(f"{name}_scale", torch.zeros(*shape[:3], 1, dtype=torch.bfloat16))

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for name, new in (("k", k), ("v", v)):
            if self.int8:
                scale = new.abs().amax(-1, keepdim=True).clamp(min=1e-6) / 127
                getattr(self, f"{name}_scale").index_copy_(2, positions, scale)
                new = (new / scale).round().clamp(-127, 127).to(torch.int8)
            getattr(self, name).index_copy_(2, positions, new)

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.int8:
            return self.k, self.v
        return self.k.to(torch.bfloat16) * self.k_scale, self.v.to(torch.bfloat16) * self.v_scale


@dataclass(frozen=True)
class Layout:
    """A step's token rows: ``batch`` sequences of ``length`` tokens at ``positions`` (the prompts in a prefill, one
    token each in a decode step), then ``chunk`` tokens of a new prompt that a decode step carries along (a serving
    engine's chunked prefill: they ride the same weight reads). Every block works on the rows as one matrix; only the
    attention splits them."""

    batch: int
    length: int
    positions: torch.Tensor
    prefill: bool
    chunk: int = 0


class Attention(nn.Module):
    def __init__(self, args: argparse.Namespace, tp: Parallel) -> None:
        super().__init__()
        self.tp, self.head_dim = tp, args.head_dim
        self.heads, self.kv_heads = args.heads // tp.size, args.kv_heads // tp.size
        self.q = Projection(args.d_model, self.heads * args.head_dim, args.int8)
        self.k = Projection(args.d_model, self.kv_heads * args.head_dim, args.int8)
        self.v = Projection(args.d_model, self.kv_heads * args.head_dim, args.int8)
        self.out = Projection(self.heads * args.head_dim, args.d_model, args.int8)
        self.cache = KVCache(args.batch, self.kv_heads, args.context + args.steps, args.head_dim, args.kv_int8)

    def heads_of(self, rows: torch.Tensor, batch: int, length: int) -> torch.Tensor:
        return rows.reshape(batch, length, -1, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """x: the step's token rows, [batch x length (+ chunk), d_model] (module docstring of Layout)."""
        q, k, v = (p(x) for p in (self.q, self.k, self.v))
        main = layout.batch * layout.length
        qm, km, vm = (self.heads_of(t[:main], layout.batch, layout.length) for t in (q, k, v))
        qm, km = rotary(qm, layout.positions), rotary(km, layout.positions)
        self.cache.write(layout.positions, km, vm)
        gqa = self.heads != self.kv_heads
        if layout.prefill:   # the prompts attend to themselves, causally (a flash kernel's work)
            o = F.scaled_dot_product_attention(qm, km, vm, is_causal=True, enable_gqa=gqa)
        else:                # one new token a sequence attends to the whole cache, the positions not yet written masked
            keys, values = self.cache.read()
            mask = (torch.arange(keys.shape[2], device=x.device) <= layout.positions[-1])[None]
            if self.cache.int8:
                o = grouped_attention(qm, keys, values, mask)
            else:
                o = F.scaled_dot_product_attention(qm, keys, values, attn_mask=mask, enable_gqa=gqa)
        o = o.transpose(1, 2).reshape(main, -1)
        if layout.chunk:     # a new prompt's chunk attends to itself, causally
            qc, kc, vc = (self.heads_of(t[main:], 1, layout.chunk) for t in (q, k, v))
            at = torch.arange(layout.chunk, device=x.device)
            oc = F.scaled_dot_product_attention(rotary(qc, at), rotary(kc, at), vc, is_causal=True, enable_gqa=gqa)
            o = torch.cat((o, oc.transpose(1, 2).reshape(layout.chunk, -1)))
        return self.tp.reduce(self.out(o))


class MLP(nn.Module):
    def __init__(self, args: argparse.Namespace, tp: Parallel) -> None:
        super().__init__()
        self.tp, hidden = tp, args.mlp_dim // tp.size
        self.gate = Projection(args.d_model, hidden, args.int8)
        self.up = Projection(args.d_model, hidden, args.int8)
        self.down = Projection(hidden, args.d_model, args.int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.reduce(self.down(F.silu(self.gate(x)) * self.up(x)))


class Block(nn.Module):
    def __init__(self, args: argparse.Namespace, tp: Parallel) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(args.d_model), nn.RMSNorm(args.d_model)
        self.attention, self.mlp = Attention(args, tp), MLP(args, tp)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), layout)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """A Llama-style decoder; ``prefill`` and ``decode`` each return the next token of every sequence."""

    def __init__(self, args: argparse.Namespace, tp: Parallel) -> None:
        super().__init__()
        self.tp = tp
        self.tokens = nn.Parameter(torch.empty(args.vocab // tp.size, args.d_model), requires_grad=False)
        self.blocks = nn.ModuleList(Block(args, tp) for _ in range(args.layers))
        self.norm = nn.RMSNorm(args.d_model)
        self.head = Projection(args.d_model, args.vocab // tp.size, args.int8)

    def next_token(self, tokens: torch.Tensor, layout: Layout, chunk: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tp.embed(self.tokens, tokens if chunk is None else torch.cat((tokens.reshape(-1), chunk.reshape(-1))))
        x = x.reshape(-1, x.shape[-1])
        for block in self.blocks:
            x = block(x, layout)
        last = x[: layout.batch * layout.length].view(layout.batch, layout.length, -1)[:, -1]
        logits = self.tp.gather_vocab(self.head(self.norm(last)))
        return logits.argmax(-1, keepdim=True)

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(prompt.shape[1], device=prompt.device)
        return self.next_token(prompt, Layout(prompt.shape[0], prompt.shape[1], positions, True))

    def decode(self, token: torch.Tensor, position: torch.Tensor, chunk: torch.Tensor | None = None) -> torch.Tensor:
        layout = Layout(token.shape[0], 1, position, False, 0 if chunk is None else chunk.shape[-1])
        return self.next_token(token, layout, chunk)


@torch.no_grad()
def initialise(model: nn.Module, seed: int = 0) -> None:
    """Random weights in place on the model's device (the same draws on "tpu" as on the CPU)."""
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dtype == torch.int8:
            p.random_(-127, 128)
        elif name.endswith("scale"):
            p.fill_(0.02 / 127)
        elif p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)
    for b in model.buffers():
        b.zero_()


def phase(device: str, name: str) -> contextlib.AbstractContextManager:
    """tpusim's phase marker on "tpu"; nothing elsewhere."""
    if device != "tpu":
        return contextlib.nullcontext()
    import tpusim.backend

    return tpusim.backend.phase(name)


def parallel_group(tp: int) -> Parallel:
    """The process group of ``tp`` chips (all of them by default) when launched over several, else none."""
    if "WORLD_SIZE" not in os.environ:
        if tp > 1:
            raise SystemExit("--tp > 1 needs a launcher: tpusim run --topology ... (or torchrun)")
        return Parallel(None, 1)
    dist.init_process_group("tpusim")
    world = dist.get_world_size()
    tp = tp or world
    if world % tp:
        raise SystemExit(f"--tp {tp} does not divide the {world} chips")
    if tp == world:
        return Parallel(dist.group.WORLD, tp)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (world // tp, tp), mesh_dim_names=("replica", "tp"))
    return Parallel(mesh.get_group("tp"), tp)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 2), ("d-model", 256), ("heads", 4), ("kv-heads", 0), ("head-dim", 0),
                          ("mlp-dim", 0), ("vocab", 1024)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--batch", type=int, default=4, help="sequences decoded together (per replica)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=4, help="decode steps (output tokens after the first)")
    parser.add_argument("--chunk", type=int, default=0,
                        help="prompt tokens of a new request each decode step carries (chunked prefill, as vLLM mixes "
                             "arriving prompts into decode steps); 0: pure decode steps")
    parser.add_argument("--tp", type=int, default=0, help="tensor-parallel degree (default: every chip)")
    parser.add_argument("--int8", action="store_true", help="int8 weights and activations in every projection")
    parser.add_argument("--kv-int8", action="store_true", help="the KV cache in int8")
    parser.add_argument("--device", default="tpu")
    args = parser.parse_args()
    args.kv_heads = args.kv_heads or args.heads
    args.head_dim = args.head_dim or args.d_model // args.heads
    args.mlp_dim = args.mlp_dim or 4 * args.d_model
    return args


def main() -> None:
    args = arguments()
    tp = parallel_group(args.tp) if args.device == "tpu" else Parallel(None, 1)
    for name, size in (("--heads", args.heads), ("--kv-heads", args.kv_heads), ("--mlp-dim", args.mlp_dim),
                       ("--vocab", args.vocab)):
        if size % tp.size:
            raise SystemExit(f"{name} {size} does not divide over tensor-parallel degree {tp.size}")
    with torch.device("meta"):
        model = Decoder(args, tp).to(torch.bfloat16)   # the int8 weights stay int8 (`to` casts floats only)
    model.to_empty(device=args.device)
    initialise(model)
    # torch.compile's backend for graphs on "tpu" is tpusim's; on the CPU, "eager" spares Inductor's C++ build
    backend = {} if args.device == "tpu" else {"backend": "eager"}
    prefill, decode = (torch.compile(f, fullgraph=True, **backend) for f in (model.prefill, model.decode))
    draws = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (args.batch, args.context), generator=draws)
    chunk = torch.randint(0, args.vocab, (1, args.chunk), generator=draws).to(args.device) if args.chunk else None
    with torch.no_grad():
        with phase(args.device, "prefill"):
            token = prefill(prompt.to(args.device))
        tokens = [token]
        for position in range(args.context, args.context + args.steps):
            with phase(args.device, "decode"):
                token = decode(token, torch.tensor([position], device=args.device), chunk)
            tokens.append(token)
    if os.environ.get("TPUSIM_NUMERICS", "on") != "off":       # a shape-only run has no values to print
        print("tokens:", torch.cat(tokens, dim=1).cpu().tolist())
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
