"""A compiled graph with functional collectives: XLA programs between them, the collectives run by c10d.

Why: DTensor, FSDP2 and funcol trace to ``_c10d_functional`` ops (``all_gather_into_tensor``,
``all_reduce``, ``reduce_scatter_tensor``, ... and ``wait_tensor``) inside the graphs torch.compile
hands the tpu backend. JAX has no lowering for a c10d process group, and a graph that held one used
to run op by op. Here such a graph runs as compiled segments (each one ``JaxGraph``: one XLA program,
priced as one program) with each collective between them run by the "tpusim" c10d backend on the
real tensors, so numerics are exact under ``--ranks all`` and follow the symmetry rule under
``--ranks one``.

**Latency-hiding schedule** (as XLA's async collective fusion on TPU does): before splitting, each
collective is moved up to just after the last node its inputs need, and each ``wait_tensor`` down to
just before the first node that reads its result; the collective is recorded as asynchronous, so the
simulator runs it on ICI while the compute between start and wait runs on the TensorCore, and only
what is left when a reader needs the result is exposed (``Timeline.collective_exposed_s``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx

from tpusim.backend.program_trace import recorder

COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional")


def is_collective(node: torch.fx.Node) -> bool:
    """A functional collective (or its wait) node."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace in COLLECTIVE_NAMESPACES)


def _is_wait(node: torch.fx.Node) -> bool:
    return is_collective(node) and node.target._schema.name.endswith("wait_tensor")


def has_collectives(gm: torch.fx.GraphModule) -> bool:
    return any(is_collective(n) for n in gm.graph.nodes)


def schedule_for_overlap(gm: torch.fx.GraphModule) -> None:
    """Reorder ``gm`` in place: collectives start as early and are waited on as late as data allows."""
    nodes = list(gm.graph.nodes)
    last_placeholder = max((n for n in nodes if n.op == "placeholder"), key=nodes.index, default=None)
    for node in [n for n in nodes if is_collective(n) and not _is_wait(n)]:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        deps = [*node.all_input_nodes, *([last_placeholder] if last_placeholder else [])]
        anchor = max(deps, key=order.__getitem__, default=None)   # never among the placeholders
        if anchor is not None and order[anchor] + 1 < order[node]:
            anchor.append(node)
    for node in [n for n in gm.graph.nodes if _is_wait(n)]:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        users = [u for u in node.users if u.op != "output"]
        if users:
            first = min(users, key=order.__getitem__)
            if order[first] - 1 > order[node]:
                first.prepend(node)
        else:
            output = next(n for n in gm.graph.nodes if n.op == "output")
            output.prepend(node)
    gm.graph.lint()
    gm.recompile()


def _runs_eagerly(node: torch.fx.Node, eager: set[torch.fx.Node]) -> bool:
    """Collectives, and ``getitem`` of a collective's list result, run on the device through c10d."""
    if is_collective(node):
        return True
    return node.op == "call_function" and node.target is operator.getitem and node.args[0] in eager


@dataclass
class _Segment:
    """A run of compiled nodes (``graph`` set) or one eagerly run collective node (``node`` set)."""

    inputs: list[torch.fx.Node]
    outputs: list[torch.fx.Node]
    graph: Callable | None = None
    node: torch.fx.Node | None = None


def _split(gm: torch.fx.GraphModule) -> list[tuple[bool, list[torch.fx.Node]]]:
    """(eager?, nodes) runs of the graph's computing nodes, in order."""
    runs: list[tuple[bool, list[torch.fx.Node]]] = []
    eager: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if _runs_eagerly(node, eager):
            eager.add(node)
            runs.append((True, [node]))
        elif runs and not runs[-1][0]:
            runs[-1][1].append(node)
        else:
            runs.append((False, [node]))
    return runs


def _subgraph(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node], later: set[torch.fx.Node]
              ) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[torch.fx.Node]]:
    """The nodes as a GraphModule of their own: its inputs (nodes defined before) and outputs (read later)."""
    inside = set(nodes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in inside and a not in env and a.op != "get_attr":
                env[a] = graph.placeholder(a.name)
                env[a].meta = dict(a.meta)
                inputs.append(a)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda a: env[a] if a in env else graph.get_attr(a.target))
    outputs = [n for n in nodes if any(u in later for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(gm, graph), inputs, outputs


class SegmentedGraph:
    """A graph with functional collectives, run as compiled segments and c10d collectives (module docstring).
    Boxed calling convention, as aot_autograd's compilers return."""

    def __init__(self, gm: torch.fx.GraphModule, compile_segment: Callable[[torch.fx.GraphModule, list, int],
                                                                          Callable]) -> None:
        self._boxed_call = True     # an instance attribute: Dynamo's wrappers copy __dict__, not the class
        self.whole: recorder.WholeGraph | None = None   # the graph lowered whole for the TPU compiler (jax_backend.py)
        schedule_for_overlap(gm)
        self.gm = gm
        nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        out = nodes[-1]
        self.output_args = out.args[0]
        runs = _split(gm)
        self.segments: list[_Segment] = []
        for i, (eager, run) in enumerate(runs):
            later = {n for _, r in runs[i + 1:] for n in r} | {out}
            if eager:
                self.segments.append(_Segment(list(run[0].all_input_nodes), [run[0]], node=run[0]))
                continue
            sub, inputs, outputs = _subgraph(gm, run, later)
            fakes = [a.meta.get("val") for a in inputs]
            self.segments.append(_Segment(inputs, outputs, graph=compile_segment(sub, fakes, len(self.segments))))
        self.last_use = self._last_uses()

    def _last_uses(self) -> dict[torch.fx.Node, int]:
        """Segment index after which each value is no longer needed (freed early, like the boxed inputs)."""
        last: dict[torch.fx.Node, int] = {}
        for i, seg in enumerate(self.segments):
            for a in seg.inputs:
                last[a] = i
        return last

    @property
    def collectives(self) -> int:
        return sum(1 for s in self.segments if s.node is not None and is_collective(s.node) and not _is_wait(s.node))

    @property
    def compiled_segments(self) -> int:
        return sum(1 for s in self.segments if s.graph is not None)

    def __call__(self, args: list) -> list:
        if self.whole is None:
            return self._run(args)
        with recorder.graph_run(self.whole):
            return self._run(args)

    def _run(self, args: list) -> list:
        env: dict[torch.fx.Node, object] = dict(zip(self.placeholders, args))
        args.clear()
        needed: list[torch.fx.Node] = []
        torch.fx.node.map_arg(self.output_args, needed.append)
        kept = set(needed)

        def fetch(a: torch.fx.Node) -> object:
            return env[a] if a in env else getattr(self.gm, a.target)

        for i, seg in enumerate(self.segments):
            if seg.node is not None:
                node = seg.node
                call_args = torch.fx.node.map_arg(node.args, fetch)
                call_kwargs = torch.fx.node.map_arg(node.kwargs, fetch)
                env[node] = node.target(*call_args, **call_kwargs)
            else:
                outs = seg.graph([env[a] for a in seg.inputs])
                env.update(zip(seg.outputs, outs))
            for a in seg.inputs:
                if self.last_use.get(a) == i and a not in kept:
                    env.pop(a, None)
        result = torch.fx.node.map_arg(self.output_args, lambda n: env[n])
        return list(result) if isinstance(result, (tuple, list)) else [result]
