"""XLA's optimized, scheduled HLO text (what the TPU compiler returns) -> the facts tpusim prices by.

Only the grammar XLA prints is read: computations (``ENTRY`` marks the program, ``is_scheduled`` makes
text order the schedule), one instruction a line, each fusion's ``backend_config`` JSON with XLA's own
``estimated_cycles`` and ``estimated_vmem_bytes``. A computation a fusion calls is inside that fusion;
the others (the entry, while bodies, async wrappers) are scheduled. A while loop's body counts as many
times as its condition's ``compare(i, constant(N)), direction=LT`` says.

A fusion's work is read from its insides, so tpusim's own compute and HBM model can price the kernel XLA
built: FLOPs of each ``dot`` (2 x output elements x contracted size) and ``convolution`` (2 x batch x input
features per group x output features x the window taps that meet input, ``_convolution_matmul``), one
FLOP per output element of each arithmetic instruction, one transcendental per element of each
transcendental one; HBM bytes are what crosses the kernel's boundary (``boundary_bytes``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
               "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
               "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "token": 0}
# Instructions that do one VPU FLOP per output element / one transcendental per output element (inside a
# fusion). Adding an opcode = one entry here.
ARITHMETIC = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare",
                        "select", "clamp", "and", "or", "xor", "not", "remainder", "sign", "floor", "ceil",
                        "round-nearest-even", "round-nearest-afz", "convert", "shift-left", "shift-right-logical",
                        "shift-right-arithmetic", "reduce", "reduce-window", "scatter"})
TRANSCENDENTAL = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic",
                            "rsqrt", "sqrt", "cbrt", "power", "sine", "cosine", "tan", "atan2", "erf"})
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s+=\s+(.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_DIMS = re.compile(r"(\w+)_dims=\{([\d,]*)\}")


@dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    shape: str
    arguments: str                     # the text inside the opcode's parentheses ("4" for constant(4))
    attributes: str
    estimated_cycles: int | None = None
    estimated_vmem_bytes: int | None = None

    @property
    def output_bytes(self) -> int:
        return shape_bytes(self.shape)

    @property
    def operands(self) -> tuple[str, ...]:
        return tuple(re.findall(r"%([\w.\-]+)", self.arguments))

    def attribute(self, key: str) -> str | None:
        found = re.search(rf"\b{key}=%?([\w.\-]+)", self.attributes)
        return found.group(1) if found else None


@dataclass(frozen=True)
class Work:
    """What a fused computation computes: FLOPs, transcendentals, and its largest contraction."""

    flops: float = 0.0
    transcendentals: float = 0.0
    matmul: tuple[int, int, int, int] | None = None   # (batch, m, k, n) of its largest dot or convolution
    dtype: str = ""                                    # that contraction's input type ("" without one)


@dataclass(frozen=True)
class Fusion:
    """One kernel XLA built: its name, kind (kLoop, kOutput, kInput, kCustom), XLA's own estimates, and
    the work and HBM bytes tpusim prices it by."""

    name: str
    kind: str
    estimated_cycles: int
    estimated_vmem_bytes: int
    output_bytes: int
    times: int = 1                     # runs per program execution (inside a while loop: its trip count)
    read_bytes: int = 0                # HBM bytes in and out of one run (``boundary_bytes``)
    written_bytes: int = 0
    work: Work = Work()
    dtype: str = ""                    # its output's element type


@dataclass(frozen=True)
class XlaCollective:
    """A collective as scheduled: synchronous, or a start/done pair with the cycles of what runs between."""

    opcode: str
    bytes: int
    is_async: bool
    overlapped_cycles: int = 0


@dataclass(frozen=True)
class Step:
    """One entry of XLA's schedule of one execution, loops unrolled: a kernel (``fusion``), a synchronous
    collective, or an async collective's start or done (``key`` pairs them)."""

    what: str                          # "kernel", "collective", "start" or "done"
    fusion: Fusion | None = None
    opcode: str = ""                   # the collective's ("all-gather", ...)
    bytes: int = 0                     # the collective's input, per device
    dtype: str = ""
    key: str = ""


@dataclass(frozen=True)
class XlaProgram:
    fusions: tuple[Fusion, ...]
    collectives: tuple[XlaCollective, ...]
    other_cycles: int                  # scheduled non-fusion instructions with an estimate (copies, ...)
    schedule: tuple[Step, ...] = ()

    @property
    def estimated_cycles(self) -> int:
        """XLA's estimate of one execution: every kernel's cycles, loops counted, overlap not credited."""
        return sum(f.estimated_cycles * f.times for f in self.fusions) + self.other_cycles

    @property
    def kernels(self) -> int:
        return sum(f.times for f in self.fusions)


def shape_bytes(shape: str) -> int:
    """Bytes of an array or tuple shape, e.g. '(bf16[128,512]{1,0}, u32[])' (layout and tiling ignored)."""
    return int(sum(math.prod(int(d) for d in dims.split(",") if d) * DTYPE_BYTES[dtype]
                   for dtype, dims in _ARRAY.findall(shape) if dtype in DTYPE_BYTES))


def _dims(shape: str) -> list[int]:
    """The dimensions of an array shape ('bf16[8,128]{1,0}' -> [8, 128]); [] for a scalar or tuple."""
    found = _ARRAY.search(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found and not shape.startswith("(") else []


def _element_type(shape: str) -> str:
    found = _ARRAY.search(shape)
    return found.group(1) if found else ""


def _dot_matmul(instruction: Instruction, shapes: dict[str, str]) -> tuple[int, int, int, int] | None:
    """(batch, m, k, n) of a ``dot``: from its operands' shapes and its batch/contracting dimensions."""
    operands = instruction.operands
    if len(operands) < 2 or operands[0] not in shapes or operands[1] not in shapes:
        return None
    lhs, rhs = _dims(shapes[operands[0]]), _dims(shapes[operands[1]])
    dims = {key: [int(d) for d in value.split(",") if d] for key, value in _DIMS.findall(instruction.attributes)}
    batch = math.prod(lhs[d] for d in dims.get("lhs_batch", []))
    k = math.prod(lhs[d] for d in dims.get("lhs_contracting", []))
    m = math.prod(lhs) // max(1, batch * k)
    n = math.prod(rhs) // max(1, batch * math.prod(rhs[d] for d in dims.get("rhs_contracting", [])))
    return batch, m, k, n


def _window(attributes: str, rank: int) -> list[dict[str, int]]:
    """Each spatial dimension's window: size, stride, low padding, lhs and rhs dilation (XLA's defaults)."""
    found = re.search(r"window=\{([^}]*)\}", attributes)
    fields = dict(item.split("=", 1) for item in found.group(1).split()) if found else {}
    dims = [{"size": 1, "stride": 1, "pad": 0, "lhs_dilate": 1, "rhs_dilate": 1} for _ in range(rank)]
    for key in ("size", "stride", "lhs_dilate", "rhs_dilate", "pad"):
        for d, value in enumerate(fields.get(key, "").split("x") if key in fields else []):
            dims[d][key] = int(value.split("_")[0])
    return dims


def _taps(in_size: int, out_size: int, window: dict[str, int]) -> int:
    """(output position, window tap) pairs of one spatial dimension that land on a real input element (not
    padding, not a hole of lhs dilation): XLA:TPU writes batched matmuls as convolutions whose windows
    mostly miss, so counting the window's size would count work that is never done."""
    if out_size * window["size"] > 10**6:          # a real convolution this large: every tap counts
        return out_size * window["size"]
    last = (in_size - 1) * window["lhs_dilate"]
    return sum(1 for o in range(out_size) for k in range(window["size"])
               for at in [o * window["stride"] + k * window["rhs_dilate"] - window["pad"]]
               if 0 <= at <= last and at % window["lhs_dilate"] == 0)


def _convolution_matmul(instruction: Instruction, shapes: dict[str, str]) -> tuple[int, int, int, int] | None:
    """(taps, m, k, n) of a ``convolution`` (how XLA:TPU writes most matmuls): n its output features, k its
    input features per group, m its batch, taps the output positions times the window taps that meet input
    (``_taps``), so 2 x taps x m x k x n are its FLOPs."""
    operands = instruction.operands
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", instruction.attributes)
    if len(operands) < 2 or operands[0] not in shapes or not labels:
        return None
    lhs, out = _dims(shapes[operands[0]]), _dims(instruction.shape)
    lhs_labels, _, out_labels = labels.groups()
    labelled = len(lhs_labels) == len(lhs) and len(out_labels) == len(out)
    if not labelled or not {"b", "f"} <= set(lhs_labels) & set(out_labels):
        return None
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    windows = _window(instruction.attributes, len(spatial))
    taps = math.prod(_taps(lhs[lhs_labels.index(c)], out[out_labels.index(c)], windows[i])
                     for i, c in enumerate(spatial))
    groups = int((re.search(r"feature_group_count=(\d+)", instruction.attributes) or [0, 1])[1])
    batch_groups = int((re.search(r"batch_group_count=(\d+)", instruction.attributes) or [0, 1])[1])
    m = lhs[lhs_labels.index("b")] // batch_groups
    k = lhs[lhs_labels.index("f")] // groups
    n = out[out_labels.index("f")]
    return taps, m, k, n


def fused_work(name: str, comps: dict[str, list[Instruction]], seen: tuple[str, ...] = ()) -> Work:
    """The work of fused computation ``name`` and the fusions nested in it (see the module docstring)."""
    if name not in comps or name in seen:
        return Work()
    body = comps[name]
    shapes = {i.name: i.shape for i in body}
    flops = transcendentals = 0.0
    matmul, dtype = None, ""
    for instruction in body:
        elements = math.prod(_dims(instruction.shape)) if not instruction.shape.startswith("(") else 0
        contraction = None
        if instruction.opcode == "dot":
            contraction = _dot_matmul(instruction, shapes)
        elif instruction.opcode == "convolution":
            contraction = _convolution_matmul(instruction, shapes)
        elif instruction.opcode == "fusion" and instruction.attribute("calls"):
            inner = fused_work(instruction.attribute("calls"), comps, (*seen, name))
            flops, transcendentals = flops + inner.flops, transcendentals + inner.transcendentals
            if inner.matmul and (matmul is None or math.prod(inner.matmul) > math.prod(matmul)):
                matmul, dtype = inner.matmul, inner.dtype
        elif instruction.opcode in TRANSCENDENTAL:
            transcendentals += elements
        elif instruction.opcode in ARITHMETIC:
            operand = shapes.get(instruction.operands[0], "") if instruction.operands else ""
            flops += math.prod(_dims(operand)) if instruction.opcode.startswith("reduce") and operand else elements
        if contraction:
            flops += 2.0 * math.prod(contraction)
            if matmul is None or math.prod(contraction) > math.prod(matmul):
                matmul, dtype = contraction, _element_type(shapes.get(instruction.operands[0], instruction.shape))
    return Work(flops, transcendentals, matmul, dtype)


SLICES = ("slice", "dynamic-slice")
IN_PLACE = "dynamic-update-slice"


def boundary_bytes(calls: str, comps: dict[str, list[Instruction]], output_bytes: int) -> tuple[int, int]:
    """(read, written) HBM bytes of one run of the fusion calling ``calls``: a parameter read only through
    slices costs the slices, a buffer a ``dynamic-update-slice`` updates in place costs nothing to read and
    only its update to write (the rest of it never moves); every other parameter and output in full."""
    body = comps.get(calls, [])
    users: dict[str, list[tuple[Instruction, int]]] = {}
    for instruction in body:
        for position, operand in enumerate(instruction.operands):
            users.setdefault(operand, []).append((instruction, position))
    shapes = {i.name: i.shape for i in body}
    read = 0
    root = next((i for i in reversed(body) if i.opcode != "parameter"), None)
    for parameter in (i for i in body if i.opcode == "parameter"):
        uses = users.get(parameter.name, [])
        if uses and all(u.opcode == IN_PLACE and k == 0 for u, k in uses):
            continue
        if uses and all(u.opcode in COLLECTIVES or u is root and u.opcode == "tuple" for u, _ in uses):
            continue                # a collective's shard, or passed through: the ICI model moves it
        if uses and all(u.opcode in SLICES and k == 0 for u, k in uses):
            read += min(parameter.output_bytes, sum(u.output_bytes for u, _ in uses))
        else:
            read += parameter.output_bytes
    roots = [root] if root is not None and root.opcode != "tuple" else \
        [next((i for i in body if i.name == o), None) for o in (root.operands if root else ())]
    written = 0
    for out in roots:
        if out is not None and out.opcode in (*COLLECTIVES, "parameter", "custom-call"):
            continue                # a collective's progress or a passthrough of an async collective fusion
        if out is not None and out.opcode == IN_PLACE and len(out.operands) > 1:
            written += shape_bytes(shapes.get(out.operands[1], ""))
        else:
            written += out.output_bytes if out is not None else 0
    return read, written if roots else output_bytes


def _closing(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced parentheses in {text[:80]!r}")


def _backend_config(attributes: str) -> dict:
    at = attributes.find("backend_config=")
    if at < 0:
        return {}
    raw = attributes[at + len("backend_config="):]
    try:
        value, _ = json.JSONDecoder().raw_decode(raw)
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return {}


def _find(config: object, key: str) -> object:
    """``key``'s value anywhere in nested backend_config JSON."""
    if isinstance(config, dict):
        if key in config:
            return config[key]
        config = list(config.values())
    if isinstance(config, list):
        for item in config:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def parse_instruction(line: str) -> Instruction | None:
    matched = _INSTRUCTION.match(line)
    if not matched:
        return None
    name, rest = matched.groups()
    if rest.startswith("("):
        end = _closing(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode = re.match(r"([\w\-]+)\(", rest)
    if not opcode:
        return None
    end = _closing(rest, opcode.end() - 1)
    config = _backend_config(rest[end:])
    cycles, vmem = _find(config, "estimated_cycles"), _find(config, "estimated_vmem_bytes")
    return Instruction(name, opcode.group(1), shape, rest[opcode.end():end - 1], rest[end:].split("backend_config=")[0],
                       None if cycles is None else int(cycles), None if vmem is None else int(vmem))


def computations(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """Each computation's instructions in text order, and the entry's name."""
    found: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        if current is None:
            head = _COMPUTATION.match(line)
            if head:
                current = head.group(2)
                found[current] = []
                entry = current if head.group(1) else entry
        elif line.startswith("}"):
            current = None
        else:
            instruction = parse_instruction(line)
            if instruction is not None:
                found[current].append(instruction)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return found, entry


def _trip_count(condition: list[Instruction]) -> int:
    """N of a loop condition ``compare(i, constant(N)), direction=LT``; 1 when the form is another."""
    constants = {i.name: i.arguments.strip() for i in condition if i.opcode == "constant"}
    for instruction in condition:
        if instruction.opcode == "compare" and "direction=LT" in instruction.attributes:
            for operand in instruction.operands:
                if constants.get(operand, "").isdigit():
                    return int(constants[operand])
    return 1


ASYNC_FUSION = {"AsyncCollectiveStart": "start", "AsyncCollectiveDone": "done"}
NOT_KERNELS = ("copy-start", "copy-done", "custom-call", "send", "recv", "send-done", "recv-done", "while", "call",
               "conditional", "async-start", "async-done", "get-tuple-element", "tuple", "bitcast", "parameter")


def _loose_kernel(opcode: str) -> bool:
    """Whether a scheduled instruction outside any fusion that XLA estimated is a kernel of its own (an op XLA
    left unfused: a lone add, reduce or convolution), not a prefetch, a collective or bookkeeping."""
    return opcode not in NOT_KERNELS and opcode not in COLLECTIVES and not opcode.endswith(("-start", "-done"))


def _loose(instruction: Instruction, shapes: dict[str, str], comps: dict[str, list[Instruction]],
           times: int) -> Fusion:
    """An unfused instruction as a kernel: its work as if it were a fusion of itself, its operands read."""
    inputs = [Instruction(o, "parameter", shapes.get(o, ""), "", "") for o in dict.fromkeys(instruction.operands)]
    alone = f"{instruction.name}.alone"
    work = fused_work(alone, {**comps, alone: [*inputs, instruction]})
    return Fusion(instruction.name, instruction.opcode, instruction.estimated_cycles or 0,
                  instruction.estimated_vmem_bytes or 0, instruction.output_bytes, times,
                  sum(shape_bytes(i.shape) for i in inputs), instruction.output_bytes, work,
                  _element_type(instruction.shape))


def _async_collective(fusion: Instruction, comps: dict[str, list[Instruction]]) -> Step | None:
    """The start or done of an async collective fusion (XLA:TPU's continuation fusion: a custom call
    ``AsyncCollectiveStart``/``Done`` around the collective; the compute fusions between carry it on), as a
    schedule step keyed by the collective's chain; None for any other fusion."""
    body = comps.get(fusion.attribute("calls") or "", [])
    marks = [ASYNC_FUSION[m] for i in body if i.opcode == "custom-call"
             for m in re.findall(r'custom_call_target="(\w+)"', i.attributes) if m in ASYNC_FUSION]
    collective = next((i for i in body if i.opcode in COLLECTIVES), None)
    if not marks or collective is None:
        return None
    shapes = {i.name: i.shape for i in body}
    chain = re.search(r'chain_id="([^"]*)"', collective.attributes)
    key = f"chain:{chain.group(1) if chain else collective.name}"
    sent = sum(shape_bytes(shapes.get(o, "")) for o in collective.operands)
    dtype = _element_type(shapes.get(collective.operands[0], "")) if collective.operands else ""
    return Step(marks[0], opcode=collective.opcode, bytes=sent, dtype=dtype, key=key)


def parse_program(text: str) -> XlaProgram:
    """The fusions, collectives, schedule and estimated cycles of XLA's scheduled program ``text``."""
    comps, entry = computations(text)
    fusions: list[Fusion] = []
    collectives: list[XlaCollective] = []
    other = 0

    def walk(name: str, times: int, seen: tuple[str, ...]) -> list[Step]:
        nonlocal other
        if name not in comps or name in seen:
            return []
        body = comps[name]
        position = {i.name: k for k, i in enumerate(body)}
        shapes = {i.name: i.shape for i in body}
        steps: list[Step] = []
        for k, instruction in enumerate(body):
            op = instruction.opcode
            marker = _async_collective(instruction, comps) if op == "fusion" else None
            if marker is not None:          # XLA's async collective fusion: its start or its done
                steps.append(marker)
            elif op == "fusion":
                calls = instruction.attribute("calls") or ""
                fusion = Fusion(instruction.name, instruction.attribute("kind") or "",
                                instruction.estimated_cycles or 0, instruction.estimated_vmem_bytes or 0,
                                instruction.output_bytes, times,
                                *boundary_bytes(calls, comps, instruction.output_bytes), fused_work(calls, comps),
                                _element_type(instruction.shape))
                fusions.append(fusion)
                steps.append(Step("kernel", fusion))
            elif instruction.estimated_cycles is not None and _loose_kernel(op):
                fusion = _loose(instruction, shapes, comps, times)
                fusions.append(fusion)
                steps.append(Step("kernel", fusion))
            elif instruction.estimated_cycles is not None:
                other += instruction.estimated_cycles * times
            operand = shapes.get(instruction.operands[0], "") if instruction.operands else ""
            sent = sum(shape_bytes(shapes.get(o, "")) for o in instruction.operands)   # a combined one: all of them
            if op in COLLECTIVES:
                collectives.extend([XlaCollective(op, instruction.output_bytes, False)] * times)
                steps.append(Step("collective", opcode=op, bytes=sent, dtype=_element_type(operand)))
            elif op.endswith("-start") and op[:-6] in COLLECTIVES:
                steps.append(Step("start", opcode=op[:-6], bytes=sent, dtype=_element_type(operand),
                                  key=instruction.name))
            elif op.endswith("-done") and op[:-5] in COLLECTIVES and instruction.operands:
                start = position.get(instruction.operands[0], k)
                between = sum(i.estimated_cycles or 0 for i in body[start + 1:k])
                collectives.extend([XlaCollective(op[:-5], instruction.output_bytes, True, between)] * times)
                steps.append(Step("done", opcode=op[:-5], key=instruction.operands[0]))
            if op == "while":
                loop_body, condition = instruction.attribute("body"), instruction.attribute("condition")
                trips = _trip_count(comps.get(condition, []))
                steps += walk(loop_body, times * trips, (*seen, name)) * trips
            elif op in ("call", "conditional", "async-start") and instruction.attribute("calls"):
                steps += walk(instruction.attribute("calls"), times, (*seen, name))
        return steps

    schedule = walk(entry, 1, ())
    return XlaProgram(tuple(fusions), tuple(collectives), other, tuple(schedule))
