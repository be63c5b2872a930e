"""A toy decode loop for tests/report/test_inference.py: a 2-layer attention model with a static KV cache
(one [batch, kv_heads, context, head_dim] K and V buffer per layer, written in place each step), a prefill of 16
tokens, then 8 decode steps of one token for the whole batch. Nothing is marked: the report finds the phases.
``--marked`` wraps them in ``tpusim.backend.phase``."""

import sys

import torch
import torch.nn.functional as F

BATCH, LAYERS, HEADS, HEAD_DIM, PROMPT, STEPS, CONTEXT, VOCAB = 2, 2, 4, 32, 16, 8, 32, 64
DIM = HEADS * HEAD_DIM
MARKED = "--marked" in sys.argv


def phase(name):
    import contextlib

    if not MARKED:
        return contextlib.nullcontext()
    import tpusim.backend

    return tpusim.backend.phase(name)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = torch.nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, k_cache, v_cache, pos):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        index = torch.arange(pos, pos + t, device=x.device)
        k_cache.index_copy_(2, index, k)              # the static cache: written in place, read whole
        v_cache.index_copy_(2, index, v)
        mask = torch.arange(CONTEXT, device=x.device) <= (pos + torch.arange(t, device=x.device))[:, None]
        y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        return x + self.out(y.transpose(1, 2).reshape(b, t, DIM))


device = "tpu"
embed = torch.nn.Embedding(VOCAB, DIM).to(device)
layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS)).to(device)
head = torch.nn.Linear(DIM, VOCAB, bias=False).to(device)
caches = [(torch.zeros(BATCH, HEADS, CONTEXT, HEAD_DIM, device=device),
           torch.zeros(BATCH, HEADS, CONTEXT, HEAD_DIM, device=device)) for _ in range(LAYERS)]


def forward(tokens, pos):
    x = embed(tokens)
    for layer, (k_cache, v_cache) in zip(layers, caches):
        x = layer(x, k_cache, v_cache, pos)
    return head(x[:, -1]).argmax(-1, keepdim=True)


with torch.no_grad():
    prompt = torch.randint(0, VOCAB, (BATCH, PROMPT)).to(device)
    with phase("prefill"):
        token = forward(prompt, 0)
    out = [token]
    for step in range(STEPS):
        with phase("decode"):
            token = forward(token, PROMPT + step)
        out.append(token)
    print(torch.cat(out, dim=1).shape)
