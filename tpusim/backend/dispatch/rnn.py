"""nn.GRU, nn.LSTM and nn.RNN on "tpu" outside a recording: CPU's own RNN, run once on the tensors' memory.

Why: ATen's RNN layers take another path on an accelerator than on CPU. CPU runs a whole layer as one
oneDNN call (or projects every time step's input in one matmul); an accelerator runs two matmuls and a cell
per time step, forward and backward: 290 matmuls a step for a 2-layer GRU where CPU runs 54, 1.3-1.5x CPU's
step time on "tpu" (benchmarks/bench_thirdparty.py). A TPU runs the per-step program, so that is what a
recording prices; a run that records nothing (plain python, pytest, torchrun) only needs the values, and
CPU's own kernel gives them at CPU's speed and bit for bit.

The op (``aten::gru.input`` and its siblings) gets a kernel at the device's autograd key: outside a
recording, with numerics on, on the simulator's target and with plain tensors (no torch.compile tracing,
no tensor subclass or dispatch mode), it runs CPU's op on host aliases under CPU autograd and its backward
through that graph; the device's generator stands in for CPU's, so dropout between layers draws what the
per-step path draws. Anything else takes the op's own decomposition, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from tpusim.backend.dispatch import tpu_numerics
from tpusim.backend.plumbing.state import STATE

OPS = ("gru.input", "lstm.input", "rnn_tanh.input", "rnn_relu.input")     # adding an RNN op = one name here
_LIBRARY: torch.library.Library | None = None
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_PLAIN = (torch.Tensor, torch.nn.Parameter)      # a subclass (FakeTensor, DTensor) takes the decomposition


def register() -> None:
    """Give the RNN ops their fast kernel on the device's autograd key (once per process)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    _LIBRARY = torch.library.Library("aten", "IMPL")
    for name in OPS:
        overload = getattr(torch.ops.aten, name.split(".")[0]).input
        _LIBRARY.impl(name, _kernel(overload), "AutogradPrivateUse1")


def _kernel(overload: torch._ops.OpOverload):
    def kernel(input: torch.Tensor, hx: torch.Tensor | list[torch.Tensor], params: list[torch.Tensor],
               *flags: object) -> tuple[torch.Tensor, ...]:
        hidden = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        if not _fast(input, hidden, params):
            # ATen's own C++ decomposition (OpOverload.decompose would take torch._decomp's Python one)
            return overload._op_dk(_COMPOSITE, input, hx, params, *flags)
        listed = isinstance(hx, (list, tuple))
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in (input, *hidden, *params))):
            return _HostRnn.run(overload, listed, len(hidden), flags, (input, *hidden, *params), graph=False)[1]
        return tuple(_HostRnn.apply(overload, listed, len(hidden), flags, input, *hidden, *params))
    return kernel


def _fast(input: torch.Tensor, hidden: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> bool:
    """Whether the values are all that is needed and CPU's kernel can give them on these tensors."""
    if STATE.recording or not STATE.numerics or STATE.debug or getattr(STATE.target, "name", "") != "sim":
        return False
    if tpu_numerics.is_on():                     # --numerics tpu: the gate matmuls as a TPU computes them
        return False
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    tensors = [input, *hidden, *params]
    return all(type(t) in _PLAIN and t.device.type == "tpu" and not torch._is_functional_tensor(t)
               for t in tensors)


class _HostRnn(torch.autograd.Function):
    """CPU's RNN op on host aliases; the device sees one op whose backward is CPU autograd's."""

    @staticmethod
    def run(overload, hx_is_list, hidden_count, flags, tensors, graph):  # noqa: ANN001, ANN205
        """CPU's op on the tensors' host aliases (under CPU autograd when ``graph``): (the CPU graph's outputs
        and leaves, the results as device tensors)."""
        device = tensors[0].device
        hosts = [STATE.shim.host_alias(t).detach().requires_grad_(graph and t.requires_grad) for t in tensors]
        input_, hidden, params = hosts[0], hosts[1:1 + hidden_count], hosts[1 + hidden_count:]
        with torch.set_grad_enabled(graph), _device_generator(device):
            outputs = overload(input_, hidden if hx_is_list else hidden[0], params, *flags)
        results = tuple(STATE.shim.to_device([o.detach() for o in outputs], device.index or 0))
        return (outputs, hosts), results

    @staticmethod
    def forward(ctx, overload, hx_is_list, hidden_count, flags, *tensors):  # noqa: ANN001, ANN205
        ctx.graph, results = _HostRnn.run(overload, hx_is_list, hidden_count, flags, tensors, graph=True)
        ctx.keep = tensors                    # the device memory the host aliases point into, until backward
        ctx.device = tensors[0].device
        return results

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001, ANN205
        outputs, hosts = ctx.graph
        pairs = [(o, STATE.shim.host_alias(g)) for o, g in zip(outputs, grads) if g is not None]
        wanted = [h for h in hosts if h.requires_grad]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
        index = ctx.device.index or 0
        host_grads = [next(found) if h.requires_grad else None for h in hosts]
        ctx.graph = ctx.keep = None
        device_grads = [None if g is None else STATE.shim.to_device([g], index)[0] for g in host_grads]
        return (None, None, None, None, *device_grads)


@contextlib.contextmanager
def _device_generator(device: torch.device) -> Iterator[None]:
    """CPU's default generator carries the device's state while CPU's kernel runs (dropout between layers),
    and the device's generator takes the advanced state back after, as the fallback does for random ops."""
    generator = STATE.default_generators[device.index or 0]
    cpu_state = torch.random.get_rng_state()
    torch.random.set_rng_state(generator.get_state())
    try:
        yield
    finally:
        generator.set_state(torch.random.get_rng_state())
        torch.random.set_rng_state(cpu_state)
