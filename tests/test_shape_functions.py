"""Shape functions tpusim adds for ATen ops that have none (tpusim/backend/aten/shape_functions.py).

Truth: CPU's own kernels; each op on meta tensors gives the shapes and dtypes CPU's kernel gives on real ones,
where before it stopped a shape-only run ("has no shape function")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tpusim.backend.aten import shape_functions


def _ctc_inputs(device: str) -> tuple[torch.Tensor, ...]:
    frames, batch, classes, longest = 12, 3, 5, 4
    generator = torch.Generator().manual_seed(0)
    log_probs = torch.randn(frames, batch, classes, generator=generator).log_softmax(-1)
    targets = torch.randint(1, classes, (batch, longest), generator=generator)
    inputs = (log_probs, targets, torch.full((batch,), frames), torch.full((batch,), longest))
    return tuple(t.to(device) for t in inputs)


_SHAPE_ONLY_CTC = """
import torch
import torch_tpu
lp = torch.randn(12, 3, 5, device="tpu").log_softmax(-1).requires_grad_()
t = torch.randint(1, 5, (3, 4), device="tpu")
nll, alpha = torch.ops.aten._ctc_loss.Tensor(lp, t, torch.full((3,), 12, device="tpu"),
                                             torch.full((3,), 4, device="tpu"), 0, False)
nll.sum().backward()
print(tuple(nll.shape), tuple(alpha.shape), tuple(lp.grad.shape))
"""


def test_a_shape_only_run_records_ctc_loss_and_its_backward_with_cpus_shapes() -> None:
    log_probs, targets, lengths, target_lengths = (t.requires_grad_(t.is_floating_point()) for t in _ctc_inputs("cpu"))
    nll, alpha = torch.ops.aten._ctc_loss.Tensor(log_probs, targets, lengths, target_lengths, 0, False)
    nll.sum().backward()
    env = {**os.environ, "TPUSIM_NUMERICS": "off"}
    done = subprocess.run([sys.executable, "-c", _SHAPE_ONLY_CTC], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    expected = (tuple(nll.shape), tuple(alpha.shape), tuple(log_probs.grad.shape))
    assert done.stdout.splitlines()[-1] == " ".join(map(str, expected))


def test_concatenated_targets_say_why_in_one_line() -> None:
    shape_functions.register()
    log_probs, _, lengths, target_lengths = _ctc_inputs("meta")
    with pytest.raises(RuntimeError, match="concatenated 1-D targets"):
        torch.ops.aten._ctc_loss.Tensor(log_probs, torch.empty(12, dtype=torch.long, device="meta"), lengths,
                                        target_lengths, 0, False)
