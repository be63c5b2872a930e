"""torch_tpu's model inspection helpers (``_internal.utils.utils``): ``OpTracer``, ``format_model``, ``model_memory``,
and ``log_utils.log_to_stderr``.

    with OpTracer() as tracer:
        model(x)
    print(tracer.num_atens(), tracer._pformat())        # ops per namespace, with call counts
    print(format_model(model, x, params=True, aten=True, shlo=True))

``OpTracer`` counts every op dispatched in its block (or in the function it decorates) by namespace, as
TorchTPU's does. ``format_model``'s ``shlo`` is the StableHLO tpusim's torch.compile backend makes of the
model (tpusim/backend/torch_compile/jax_backend.py ``dump_stablehlo``, which torch_tpu's ``utils.format_model``
hands in), where TorchTPU traces it in its internal defer-all mode; ``pt`` of a plain function prints the ATen graph
``make_fx`` traces.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tpusim.errors import TpusimError


class OpTracer(TorchDispatchMode, contextlib.ContextDecorator):
    """Counts the ops dispatched in its block: ``ops_log[namespace][op] = calls`` (a context manager or a
    decorator; each entry starts a fresh log)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops_log: dict[str, dict[str, int]] = collections.defaultdict(dict)

    def __enter__(self) -> OpTracer:
        super().__enter__()
        self.ops_log = collections.defaultdict(dict)
        return self

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: tuple = (),
                           kwargs: dict | None = None) -> object:
        calls = self.ops_log[func.namespace]
        calls[str(func)] = calls.get(str(func), 0) + 1
        return func(*args, **(kwargs or {}))

    def num_atens(self) -> int:
        """How many aten ops ran in the block."""
        return sum(self.ops_log["aten"].values())

    def _pformat(self) -> str:
        lines = []
        for namespace in sorted(self.ops_log):
            calls = self.ops_log[namespace]
            lines.append(f"Ops for namespace: '{namespace}' ({len(calls)} ops)")
            lines += [f"  {op}: {n}" for op, n in calls.items()]
        return "\n".join(lines)


def model_memory(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> float:
    """GB a model needs at ``dtype``: parameters (twice for trainable ones: their gradients) and buffers."""
    params = sum(p.numel() * (2 if p.requires_grad else 1) for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    return (params + buffers) * torch.empty((), dtype=dtype).element_size() / 1024**3


def format_model(model: torch.nn.Module | Callable[..., Any], *input_tensors: torch.Tensor, params: bool = False,
                 pt: bool = False, aten: bool = False, shlo: bool = False,
                 stablehlo: Callable[..., str] | None = None) -> str:
    """The model (or tensor function) described as asked: parameter counts and memory, its printout, the
    ATen ops one call runs, its StableHLO from ``stablehlo(model, *inputs)`` (the torch.compile backend's
    ``dump_stablehlo``, handed in by torch_tpu: this package sits below torch_compile/)."""
    module = model
    if not isinstance(model, torch.nn.Module):
        module = torch.fx.experimental.proxy_tensor.make_fx(model)(*input_tensors)
    text = ""
    if params:
        total = sum(p.numel() for p in module.parameters())
        trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
        text += f"Parameters: {total}, Trainable: {trainable}\n"
        text += f"Estimated Memory: {model_memory(module):.3f} GB (based on # of parameters and dtype)\n"
    if pt:
        printed = module.print_readable(print_output=False) if isinstance(module, torch.fx.GraphModule) else str(module)
        text += printed + "\n"
    if aten:
        with OpTracer() as tracer:
            model(*input_tensors)
        text += tracer._pformat() + "\n"
    if shlo:
        if stablehlo is None:
            raise TpusimError("format_model(shlo=True) needs stablehlo= (torch_tpu's utils.format_model gives it)")
        text += stablehlo(model, *input_tensors) + "\n"
    return text


def log_to_stderr() -> None:
    """Send every log record to stderr as "time [LEVEL] name: message", at INFO and up (the root logger's
    handlers replaced)."""
    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    logging.root.addHandler(handler)
    logging.root.setLevel(logging.INFO)


__all__ = ["OpTracer", "format_model", "log_to_stderr", "model_memory"]
