"""Shape functions (Meta kernels) for ATen ops that ship without one, so shape-only runs can record them.

Why: `tpusim run --numerics off` runs every op on meta tensors; an op with no Meta kernel stops the script
("has no shape function"). CTC loss is one: torch registers a Meta kernel for ``aten::_ctc_loss`` with
integer lengths but none for its ``.Tensor`` overload (what ``F.ctc_loss`` takes with tensor lengths, and
TorchTitan's Conformer trainer calls) nor for ``aten::_ctc_loss_backward``. A shape that depends on values
(the longest target of concatenated 1-D targets) raises one clear line.
"""

from __future__ import annotations

import torch

_LIBRARY: torch.library.Library | None = None


def _ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: object, target_lengths: object,
              blank: int = 0, zero_infinity: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative log-likelihood per sequence, log alpha [batch, frames, 2 x longest target + 1]) as ATen's."""
    if targets.dim() != 2 and log_probs.dim() == 3:
        raise RuntimeError("tpusim: CTC loss with concatenated 1-D targets has a value-dependent shape (the longest "
                           "target), which shape-only mode (TPUSIM_NUMERICS=off) cannot know; pass padded "
                           "(batch, longest target) targets")
    frames = log_probs.shape[0]
    batched = log_probs.dim() == 3
    batch = log_probs.shape[1] if batched else 1
    longest = targets.shape[-1]
    nll = log_probs.new_empty((batch,) if batched else ())
    alpha = log_probs.new_empty((batch, frames, 2 * longest + 1) if batched else (frames, 2 * longest + 1))
    return nll, alpha


def _ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, *rest: object, **kwargs: object) -> torch.Tensor:
    """The gradient with respect to the log-probabilities: their shape."""
    return torch.empty_like(log_probs)


KERNELS = {"_ctc_loss.Tensor": _ctc_loss, "_ctc_loss_backward": _ctc_loss_backward,
           "_ctc_loss_backward.Tensor": _ctc_loss_backward}


def register() -> None:
    """Give each op in ``KERNELS`` its Meta kernel (once per process; an op torch has since given one keeps it)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    _LIBRARY = torch.library.Library("aten", "IMPL")
    for name, kernel in KERNELS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _LIBRARY.impl(name, kernel, "Meta")
