"""Fused eager clusters through the TPU compiler: each distinct cluster's program, composed from its ops'.

TorchTPU's Fused mode hands each cluster of deferred ops to XLA as one program. tpusim forms the clusters
while pricing (``tpusim.eager.fusion``); the recording kept each distinct eager op's one-op StableHLO
program (``TraceMeta.xla_ops``). ``compose`` joins a cluster's op programs into one module: each op's
``main`` becomes a private function, and a new ``main`` takes the cluster's entering values, calls the ops
in program order wired as the cluster reads them (``ClusterCall``) and returns what leaves it. XLA then
fuses across the ops, as it would the cluster. A cluster with an op that has no program (or whose program
does not match its recorded tensors) is left to tpusim's model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tpusim.eager.fusion import ClusterCall

_MAIN = re.compile(r"func\.func public @main\((.*?)\) -> (.*?) \{\s*$", re.M)
_TYPE = re.compile(r"tensor<[^>]*>")
_SYMBOL = re.compile(r"func\.func (?:public|private) @([\w.$-]+)")


def _signature(text: str) -> tuple[list[str], list[str]] | None:
    """The argument and result types of a module's ``main``."""
    found = _MAIN.search(text)
    if found is None:
        return None
    return _TYPE.findall(found.group(1)), _TYPE.findall(found.group(2))


def _body(text: str, prefix: str) -> str:
    """The module's functions with every symbol it defines renamed under ``prefix`` (``main`` -> ``prefix``),
    all private: the lines between the module's first and last."""
    lines = text.strip().splitlines()[1:-1]
    body = "\n".join(lines)
    for name in sorted(set(_SYMBOL.findall(body)), key=len, reverse=True):
        renamed = prefix if name == "main" else f"{prefix}_{name}"
        body = re.sub(rf"@{re.escape(name)}\b", f"@{renamed}", body)
    return body.replace("func.func public", "func.func private")


def compose(call: ClusterCall, modules: Mapping[str, str]) -> str | None:
    """One module computing the whole cluster (see the module docstring), or None when an op has no program."""
    functions, lines = [], []
    types: list[tuple[list[str], list[str]]] = []
    entering: dict[int, str] = {}
    for j, (signature, wiring) in enumerate(zip(call.signatures, call.wiring)):
        text = modules.get(signature, "")
        found = _signature(text) if text else None
        if found is None or len(found[0]) != len(wiring):
            return None
        args, results = found
        for (kind, *where), arg_type in zip(wiring, args):
            if kind == "in":
                entering.setdefault(where[0], arg_type)
            elif where[1] >= len(types[where[0]][1]) or types[where[0]][1][where[1]] != arg_type:
                return None                     # the producer's result is not what this op's program takes
        types.append((args, results))
        functions.append(_body(text, f"op{j}"))
        operands = ", ".join(f"%in{w[0]}" if kind == "in" else _value(types, *w) for kind, *w in wiring)
        out = f"%r{j}:{len(results)}" if len(results) > 1 else f"%r{j}"
        result_types = results[0] if len(results) == 1 else f"({', '.join(results)})"
        lines.append(f"    {out} = func.call @op{j}({operands}) : ({', '.join(args)}) -> {result_types}")
    if len(entering) != call.entering or not call.exits:
        return None
    inputs = ", ".join(f"%in{i}: {entering[i]}" for i in range(call.entering))
    outputs = [types[j][1][k] for j, k in call.exits]
    returned = ", ".join(_value(types, j, k) for j, k in call.exits)
    main = (f"  func.func public @main({inputs}) -> ({', '.join(outputs)}) {{\n" + "\n".join(lines)
            + f"\n    return {returned} : {', '.join(outputs)}\n  }}")
    attributes = "attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}"
    return f"module @jit_cluster {attributes} {{\n" + "\n".join(functions) + "\n" + main + "\n}\n"


def _value(types: list[tuple[list[str], list[str]]], j: int, k: int) -> str:
    """Op j's k-th result (``%rj#k``; ``%rj`` when it has one)."""
    return f"%r{j}#{k}" if len(types[j][1]) > 1 else f"%r{j}"
