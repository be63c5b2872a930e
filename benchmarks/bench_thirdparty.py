"""Third-party models on CPU vs on "tpu" (recording on): training step time, side by side.

    python benchmarks/bench_thirdparty.py [--steps 20]

Models nobody here wrote, as tests/backend/test_thirdparty_models.py builds them (random init,
nothing downloaded): tiny GPT-2, BERT and T5 from ``transformers`` configs, and a small GRU
language model from plain torch.nn. Each trains with AdamW; CPU and tpu steps are interleaved
so they see the same machine load; medians. Targets (issue 31): tpu/CPU <= 1.15x outside
``tpusim run`` (nothing recorded), <= 1.5x recording, as under ``tpusim run``. Needs the optional
``transformers`` package (the thirdparty extra); without it only the GRU model runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import tpusim.backend as tb
from tpusim.trace.records import OpRecord

try:
    import transformers

    transformers.logging.set_verbosity_error()
except ImportError:  # the thirdparty extra is optional
    transformers = None


class GruLM(nn.Module):
    """A small recurrent language model: embedding, two-layer GRU, tied output head."""

    def __init__(self, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(dim, vocab)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.rnn(self.embed(input_ids))[0])
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _models() -> dict[str, Callable[[], nn.Module]]:
    models: dict[str, Callable[[], nn.Module]] = {}
    if transformers is not None:
        models["gpt2"] = lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0))
        models["bert"] = lambda: transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=16))
        models["t5"] = lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    models["gru"] = GruLM
    return models


def make(factory: Callable[[], nn.Module], device: str) -> tuple:
    torch.manual_seed(0)
    model = factory().to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (2, 12), generator=g).to(device)
    labels = torch.randint(1, 64, (2, 12), generator=g).to(device)
    return model, opt, ids, labels


def timed(model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor) -> float:
    start = time.perf_counter()
    out = model(input_ids=ids, labels=labels)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"{'model':>6} {'ops/step':>8} {'cpu (ms)':>9} {'tpu (ms)':>9} {'recording':>9} {'tpu/cpu':>7} "
          f"{'recording/cpu':>13}")
    plain, recorded = [], []
    for name, factory in _models().items():
        cpu, tpu = make(factory, "cpu"), make(factory, "tpu")
        for _ in range(2):
            timed(*cpu)
            timed(*tpu)
        cpu_times, tpu_times = [], []
        for _ in range(args.steps):             # interleaved: both see the same machine load
            cpu_times.append(timed(*cpu))
            tpu_times.append(timed(*tpu))        # plain python, pytest, torchrun: nothing recorded
        cpu_beside, recording_times = [], []
        with tb.recording() as rec:              # what `tpusim run` does around the script: one recording
            for _ in range(args.steps):
                cpu_beside.append(timed(*cpu))   # CPU tensors: nothing recorded
                recording_times.append(timed(*tpu))
        ops = len(rec.trace.of_kind(OpRecord)) // args.steps
        c, t = statistics.median(cpu_times), statistics.median(tpu_times)
        r, beside = statistics.median(recording_times), statistics.median(cpu_beside)
        plain.append(t / c)
        recorded.append(r / beside)             # against the CPU steps run beside it
        print(f"{name:>6} {ops:>8} {c * 1e3:9.2f} {t * 1e3:9.2f} {r * 1e3:9.2f} {t / c:6.2f}x {r / beside:12.2f}x")
    missing = "" if transformers is not None else " (transformers not installed: GPT-2/BERT/T5 skipped)"
    print(f"training step (AdamW, batch 2 x 12 tokens); medians of {args.steps} interleaved steps; worst tpu/cpu "
          f"{max(plain):.2f}x outside tpusim run (target <= 1.15x), {max(recorded):.2f}x recording, as under "
          f"tpusim run (target <= 1.5x){missing}")


if __name__ == "__main__":
    main()
