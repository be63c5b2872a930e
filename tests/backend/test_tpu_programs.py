"""Real programs train on "tpu" and on CPU side by side with identical seeds: losses and
gradients match."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tpu_models import MLP, GPTBlock, Recommender, SmallCNN


def _data(kind: str) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    g = torch.Generator().manual_seed(42)
    if kind == "mlp":
        return (torch.randn(16, 20, generator=g),), torch.randint(0, 5, (16,), generator=g)
    if kind == "cnn":
        return (torch.randn(8, 3, 16, 16, generator=g),), torch.randint(0, 5, (8,), generator=g)
    if kind == "gpt":
        return (torch.randint(0, 50, (4, 12), generator=g),), torch.randint(0, 50, (48,), generator=g)
    users = torch.randint(0, 100, (24,), generator=g)
    items = torch.randint(0, 200, (24,), generator=g)
    offsets = torch.arange(0, 24, 3)
    return (torch.randn(8, 4, generator=g), users, items, offsets), torch.rand(8, generator=g).round()


def _loss(kind: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if kind == "rec":
        return F.binary_cross_entropy_with_logits(out, target)
    return F.cross_entropy(out, target)


def _train(kind: str, factory: Callable[[], nn.Module], device: str, steps: int = 3) -> tuple[list, list]:
    torch.manual_seed(0)
    model = factory().to(device)
    # Adam turns the rounding noise of a zero gradient (the GPT block's key bias) into full-size
    # updates, so that model trains with SGD
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if kind == "gpt"
           else torch.optim.AdamW(model.parameters(), lr=1e-2))
    inputs, target = _data(kind)
    inputs = tuple(t.to(device) for t in inputs)
    target = target.to(device)
    losses, grads = [], []
    torch.manual_seed(1)
    for _ in range(steps):
        loss = _loss(kind, model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.detach().cpu() for p in model.parameters()]
        opt.step()
        losses.append(loss.item())
    return losses, grads + [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize(("kind", "factory"), [("mlp", MLP), ("cnn", SmallCNN), ("gpt", GPTBlock),
                                               ("rec", Recommender)])
def test_training_matches_cpu(kind: str, factory: Callable[[], nn.Module]) -> None:
    cpu_losses, cpu_tensors = _train(kind, factory, "cpu")
    tpu_losses, tpu_tensors = _train(kind, factory, "tpu")
    torch.testing.assert_close(tpu_losses, cpu_losses, atol=1e-5, rtol=1e-5)
    # the GPT block's key bias has a mathematically zero gradient (softmax ignores a per-row
    # constant): what both devices report there is rounding noise of different kernel orders
    atol = 1e-4 if kind == "gpt" else 1e-5
    for got, want in zip(tpu_tensors, cpu_tensors, strict=True):
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


def test_eval_mode_and_no_grad() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = _data("cnn")[0][0]
    with torch.no_grad():
        want = model(x)
        got = model.to("tpu")(x.to("tpu")).cpu()
    torch.testing.assert_close(got, want)


def test_autocast_training_step() -> None:
    torch.manual_seed(0)
    model = MLP().to("tpu")
    (x,), y = _data("mlp")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = model(x.to("tpu"))
        assert out.dtype == torch.bfloat16
        loss = F.cross_entropy(out, y.to("tpu"))
    loss.backward()
    assert model.net[0].weight.grad.dtype == torch.float32
    assert torch.isfinite(loss).item()
