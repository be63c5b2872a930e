"""``torch_tpu._internal.utils.utils``: ``assert_close`` (LOOSE by default), ``CheckValueMode``, ``OpTracer``,
``format_model``, ``model_memory`` (tpusim/backend/torchtpu/checks.py and tracing.py)."""

from collections.abc import Callable
from typing import Any

import torch

from tpusim.backend.torch_compile.jax_backend import dump_stablehlo
from tpusim.backend.torchtpu import tracing
from tpusim.backend.torchtpu.checks import CheckValueMode, Tolerance, assert_close
from tpusim.backend.torchtpu.modes import EagerMode
from tpusim.backend.torchtpu.tracing import OpTracer, model_memory


def format_model(model: torch.nn.Module | Callable[..., Any], *input_tensors: torch.Tensor, params: bool = False,
                 pt: bool = False, aten: bool = False, shlo: bool = False) -> str:
    """TorchTPU's ``format_model``; ``shlo`` is the StableHLO tpusim's torch.compile backend makes of the model."""
    return tracing.format_model(model, *input_tensors, params=params, pt=pt, aten=aten, shlo=shlo,
                                stablehlo=dump_stablehlo)


__all__ = ["CheckValueMode", "EagerMode", "OpTracer", "Tolerance", "assert_close", "format_model", "model_memory"]
