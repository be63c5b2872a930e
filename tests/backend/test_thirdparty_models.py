"""Hugging Face models (tiny GPT-2, BERT and T5 built from configs: random init, nothing downloaded)
train on "tpu" as on CPU: 3 AdamW steps, dropout on, losses compared step by step.

Needs the optional ``transformers`` package (skipped without it). Tolerance: relative 1e-5 on each
loss (about 80 float32 ulps). Observed on this suite: BERT and T5 bit-identical, GPT-2 within 6e-8
relative. What differs is rounding, not the model: where CPU's own path differs from an
accelerator's (SDPA with dropout or grouped-query attention takes the math path on tpu), values
agree within float32 rounding, not to the bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=16)
    return transformers.BertForMaskedLM(cfg)


def _t5() -> nn.Module:
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg)


def _train(factory: Callable[[], nn.Module], device: str, steps: int = 3) -> list[float]:
    torch.manual_seed(0)
    model = factory()
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight is embedding.weight                  # the checkpoint-format tie
    params = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.to(device).train()
    assert list(model.parameters()) == params and head.weight is embedding.weight
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (2, 12), generator=g).to(device)
    labels = torch.randint(1, 64, (2, 12), generator=g).to(device)
    torch.manual_seed(2)                                    # dropout masks: the same draws on both devices
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert embedding.weight.device.type == device
    return losses


@pytest.mark.parametrize("factory", [_gpt2, _bert, _t5], ids=["gpt2", "bert", "t5"])
def test_training_matches_cpu(factory: Callable[[], nn.Module]) -> None:
    cpu = _train(factory, "cpu")
    tpu = _train(factory, "tpu")
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=0)
    assert cpu[-1] != cpu[0]                                # it trained
