"""Run an ATen FX graph as a JAX function: the bridge from torch.fx to ``jax.jit``.

``jax_function(gm)`` returns ``fn(*arrays) -> list`` that evaluates the graph node by node with
the lowering table; ``jax.jit(fn)`` traces it once per input signature into one XLA program.
Missing ops raise ``MissingLowering`` naming every op the graph needs and the table lacks, so a
caller can fall back (or a user can add one entry) instead of failing at the first.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping

import jax
import numpy as np
import torch
import torch.fx

from tpusim.backend.lowering.creation import random_keys
from tpusim.backend.lowering.dtypes import jax_dtype
from tpusim.backend.lowering.registry import covered, inplace_target, lookup


class MissingLowering(NotImplementedError):
    """The graph uses ops the lowering table lacks."""

    def __init__(self, ops: list[str]) -> None:
        super().__init__(f"tpusim: no JAX lowering for {', '.join(ops)} (add one @register in "
                         f"tpusim/backend/lowering/<family>.py)")
        self.ops = ops


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host (CPU) torch tensor as a numpy array over its memory where it can be (a jitted call takes
    numpy arguments and moves them itself, in one C++ call, faster than building jax arrays first)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:                 # numpy has no bfloat16: move the bits
        return t.view(torch.int16).numpy().view(jax_dtype(torch.bfloat16))
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):   # nor float8 (ml_dtypes has them)
        return t.view(torch.uint8).numpy().view(jax_dtype(t.dtype))
    return t.numpy()


def tensor_to_jax(t: torch.Tensor) -> jax.Array:
    """A host (CPU) torch tensor -> jax array on jax's default device (one host copy at most)."""
    return jax.numpy.asarray(tensor_to_numpy(t))


def jax_to_tensor(a: object) -> torch.Tensor:
    """A jax (or numpy) array -> a CPU torch tensor that owns its memory (a copy unless numpy already
    handed over a writeable array of its own)."""
    host = np.asarray(a)
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.int16).copy()).view(torch.bfloat16)
    if host.dtype.name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(host.view(np.uint8).copy()).view(getattr(torch, host.dtype.name))
    return torch.from_numpy(host.copy() if not host.flags.writeable or host.base is not None else host)


def _python_op(target: object) -> bool:
    return getattr(target, "__module__", None) in ("_operator", "operator", "math", "builtins")


def needs_random(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and torch.Tag.nondeterministic_seeded in n.target.tags for n in gm.graph.nodes)


def missing_ops(gm: torch.fx.GraphModule, extra: Mapping[object, Callable] | None = None) -> list[str]:
    """The ops of ``gm`` neither the lowering table nor ``extra`` lowers."""
    missing = set()
    extra = extra or {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and not covered(n.target) \
                and n.target not in extra and n.target.overloadpacket not in extra:
            missing.add(str(n.target))
        elif n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload) \
                and n.target is not operator.getitem and not _python_op(n.target):
            missing.add(str(n.target))
    return sorted(missing)


def jax_function(gm: torch.fx.GraphModule, extra: Mapping[object, Callable] | None = None) -> Callable[..., list]:
    """``fn(*inputs)`` (plus a trailing PRNG key when ``needs_random(gm)``) evaluating ``gm`` in JAX; ``extra``
    lowers ops the table leaves out (overload or packet -> function), e.g. collectives inside a shard_map."""
    extra = extra or {}
    missing = missing_ops(gm, extra)
    if missing:
        raise MissingLowering(missing)
    nodes = list(gm.graph.nodes)
    random = needs_random(gm)
    constants = {n.name: tensor_to_jax(getattr(gm, n.target)) for n in nodes if n.op == "get_attr"
                 and isinstance(getattr(gm, n.target), torch.Tensor)}

    def fn(*inputs: object) -> list:
        if random:
            *inputs, key = inputs
        else:
            key = None
        env: dict[str, object] = {}
        it = iter(inputs)

        def load(a: object) -> object:
            return env[a.name] if isinstance(a, torch.fx.Node) else a

        with random_keys(key) if random else _null():
            for n in nodes:
                if n.op == "placeholder":
                    env[n.name] = next(it)
                elif n.op == "get_attr":
                    env[n.name] = constants.get(n.name, getattr(gm, n.target))
                elif n.op == "call_function":
                    args = torch.fx.node.map_aggregate(n.args, load)
                    kwargs = torch.fx.node.map_aggregate(n.kwargs, load)
                    special = extra.get(n.target) or extra.get(getattr(n.target, "overloadpacket", None))
                    if special is not None:
                        env[n.name] = special(*args, **kwargs)
                    elif isinstance(n.target, torch._ops.OpOverload):
                        entry = lookup(n.target)
                        if entry is None:              # in-place op left by a decomposition: rebind self
                            functional = lookup(inplace_target(n.target)).fn
                            value = functional(*args, **kwargs)
                            value = value.astype(args[0].dtype) if value.dtype != args[0].dtype else value
                            env[n.name] = env[n.args[0].name] = value
                            continue
                        env[n.name] = entry.fn(*args, **kwargs)
                    else:
                        env[n.name] = n.target(*args, **kwargs)
                elif n.op == "output":
                    out = torch.fx.node.map_aggregate(n.args[0], load)
                    return list(out) if isinstance(out, (tuple, list)) else [out]
        raise RuntimeError("graph has no output node")

    return fn


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
