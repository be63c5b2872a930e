"""What an ATen overload's schema says about its arguments: read once per overload, here only.

Why one module: the fallback (which arguments to convert to host aliases, which to sync back),
the PJRT target (run an in-place or out= op as its functional counterpart; keep a view op on the
host), the lowering table (an in-place op a decomposition left behind) and compiled programs
(views rename a value, they are not ops) all ask the same questions of ``op._schema``:

- ``written_positions`` / ``written_keywords``: the arguments the op writes (``Tensor(a!)``);
- ``returns_view``: a return aliases an input without writing it (``Tensor(a)``): a view op;
- ``writes_self_only``: it writes exactly its first positional ``Tensor`` (``add_``, ``copy_``);
- ``writes_out_only``: it writes only kwarg-only (out=) arguments and returns each (``add.out``);
- ``functional_of(op)``: the overload computing what an in-place or out= overload writes;
- the argument kinds the fallback converts (``TENSOR``, ``TENSOR_LIST``, ``DEVICE``,
  ``GENERATOR``, ``DTYPE``) and where the ``Generator?`` argument is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OpOverload = torch._ops.OpOverload

# Argument kinds the fallback converts (0: passed through as it is).
TENSOR, TENSOR_LIST, DEVICE, GENERATOR, DTYPE = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class SchemaFacts:
    """The facts of one overload (see the module docstring)."""

    name: str                                   # "aten::add_"
    positional: tuple[tuple[int, int], ...]     # (position, kind) of the positional arguments to convert
    keyword: tuple[tuple[str, int], ...]        # (name, kind) of the kwarg-only arguments to convert
    written_positions: tuple[int, ...]
    written_keywords: tuple[str, ...]
    generator_position: int                     # position of a positional Generator? argument, -1 if none
    generator_keyword: str                      # name of a kwarg-only Generator? argument, "" if none
    returns_view: bool
    writes_self_only: bool
    writes_out_only: bool

    @property
    def writes(self) -> bool:
        return bool(self.written_positions or self.written_keywords)


_FACTS: dict[OpOverload, SchemaFacts] = {}


def _kind(arg: torch._C.Argument) -> int:
    text = str(arg.type)
    if text.startswith("Optional["):
        text = text[9:-1]
    if text == "Tensor":
        return TENSOR
    if text in ("List[Tensor]", "List[Optional[Tensor]]"):
        return TENSOR_LIST
    if text == "Device":
        return DEVICE
    if text == "Generator":
        return GENERATOR
    if text == "int" and arg.name == "dtype":
        return DTYPE
    return 0


def _written(arg: torch._C.Argument) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def facts(op: OpOverload) -> SchemaFacts:
    """The schema facts of ``op``, computed at its first call."""
    found = _FACTS.get(op)
    if found is None:
        found = _FACTS[op] = _read(op._schema)
    return found


def _read(schema: torch._C.FunctionSchema) -> SchemaFacts:
    arguments = schema.arguments
    positional, keyword, written_positions, written_keywords = [], [], [], []
    generator_position, generator_keyword = -1, ""
    for i, arg in enumerate(arguments):
        kind = _kind(arg)
        if arg.kwarg_only:
            if kind:
                keyword.append((arg.name, kind))
            if _written(arg):
                written_keywords.append(arg.name)
            if kind == GENERATOR:
                generator_keyword = arg.name
        else:
            if kind:
                positional.append((i, kind))
            if _written(arg):
                written_positions.append(i)
            if kind == GENERATOR:
                generator_position = i
    writes = [i for i, a in enumerate(arguments) if _written(a)]
    return SchemaFacts(
        name=schema.name,
        positional=tuple(positional),
        keyword=tuple(keyword),
        written_positions=tuple(written_positions),
        written_keywords=tuple(written_keywords),
        generator_position=generator_position,
        generator_keyword=generator_keyword,
        returns_view=any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns),
        writes_self_only=writes == [0] and not arguments[0].kwarg_only and str(arguments[0].type) == "Tensor",
        writes_out_only=bool(writes) and all(arguments[i].kwarg_only for i in writes)
        and len(schema.returns) == len(writes),
    )


def functional_of(op: OpOverload) -> OpOverload | None:
    """The functional overload computing what an in-place (``add_``) or out= (``add.out``) overload writes."""
    schema = op._schema
    name = schema.name.removeprefix("aten::")
    if name.endswith("_") and not name.endswith("__"):
        packet = getattr(torch.ops.aten, name[:-1], None)
        if packet is None:
            return None
        same = getattr(packet, op._overloadname, None)
        if same is not None:
            return same
        names = [a.name for a in schema.arguments]
        return next((getattr(packet, ov) for ov in packet.overloads()
                     if [a.name for a in getattr(packet, ov)._schema.arguments] == names), None)
    want = [a.name for a in schema.arguments if not (a.kwarg_only and _written(a))]
    packet = op.overloadpacket
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        args = cand._schema.arguments
        if cand is not op and not any(_written(a) for a in args) and [a.name for a in args] == want:
            return cand
    return None
