"""Communication patterns on one ``Line`` (an axis ring or line, a DCN ring, a logical ring).

Each function returns the concurrent ``TransferStream``s of one phase. ``variant`` is "uni" (one ring
direction) or "bidi" (both directions at once). What moves (bytes per step) is derived in
closed_form.py next to the matching formula; the two are kept in step by the tests.

On a line (no wraparound):
- "uni" AG/RS/A2A use the *folded ring* 0 -> 2 -> 4 ... -> 5 -> 3 -> 1 -> 0: every logical edge is
  one or two hops and every one-way channel of the line is used exactly once.
- "bidi" AG/RS/A2A are two pipelines, up and down the line, each starting at one end.
- broadcast/reduce are chains from (to) the root, up and down.
"""

from __future__ import annotations

from tpusim.network.collectives.groups import Line, Path
from tpusim.network.collectives.plan import Step, Transfer, TransferStream


def _step(transfers, repeat: int = 1) -> Step:
    return Step(tuple(t for t in transfers if t.path), repeat)


def _uniform(paths: list[Path], nbytes: float, repeat: int) -> Step:
    return _step([Transfer(p, nbytes) for p in paths], repeat)


def folded_order(n: int) -> list[int]:
    """0, 2, 4, ..., then the odd positions downwards: a ring embedded in a line."""
    return list(range(0, n, 2)) + list(range(n - 1 - (n % 2 == 1), 0, -2)) if n > 2 else list(range(n))


def _folded_edges(line: Line) -> list[Path]:
    order = folded_order(line.n)
    return [line.path(order[i], order[(i + 1) % line.n]) for i in range(line.n)]


def ag_rs(line: Line, data: float, variant: str, reduce: bool) -> list[TransferStream]:
    """All-gather (output ``data`` per rank) or reduce-scatter (input ``data`` per rank)."""
    n = line.n
    if n < 2:
        return []
    shard = data / n
    c = line.copies
    if line.cyclic and variant == "bidi":
        # each direction covers half of the other ranks; for even n the opposite rank's shard is
        # split in two halves, one per direction, in the last step.
        full = (n - 1) // 2 if n % 2 else n // 2 - 1
        out = []
        for paths in (list(line.fwd), list(line.bwd)):
            steps = []
            if full:
                steps.append(_uniform(paths, shard, full))
            if n % 2 == 0:
                steps.append(_uniform(paths, shard / 2, 1))
            out.append(TransferStream(tuple(steps), c))
        return out
    if line.cyclic:  # one direction, n-1 steps of one shard on every edge
        return [TransferStream((_uniform(list(line.fwd), shard, n - 1),), c)]
    if variant == "uni":
        return [TransferStream((_uniform(_folded_edges(line), shard, n - 1),), c)]
    # bidi on a line: pipelines up and down. AG: at step t the link i -> i+1 forwards the shard of
    # rank i-t+1, so it is busy for steps 1..i+1; RS is its time-reverse (busy for steps i+1..n-1).
    ups, downs = [], []
    for t in range(1, n):
        if reduce:
            up_links = range(0, t)
            down_links = range(n - 1, n - 1 - t, -1)
        else:
            up_links = range(t - 1, n - 1)
            down_links = range(n - t, 0, -1)
        ups.append(_uniform([line.fwd[i] for i in up_links], shard, 1))
        downs.append(_uniform([line.bwd[i] for i in down_links], shard, 1))
    return [TransferStream(tuple(ups), c), TransferStream(tuple(downs), c)]


def all_to_all(line: Line, buffer: float, variant: str) -> list[TransferStream]:
    """All-to-all by forwarding: at each step every rank passes on, in one message, the pieces
    (``buffer / n`` each) still headed further along the ring or line."""
    n = line.n
    if n < 2:
        return []
    piece = buffer / n
    c = line.copies
    if line.cyclic and variant == "bidi":
        far = n // 2 if n % 2 == 0 else (n - 1) // 2
        weights = [1.0] * far
        if n % 2 == 0:
            weights[-1] = 0.5  # the opposite rank's piece goes half each way
        out = []
        for paths in (list(line.fwd), list(line.bwd)):
            steps = [_uniform(paths, piece * sum(weights[t:]), 1) for t in range(far)]
            out.append(TransferStream(tuple(steps), c))
        return out
    if line.cyclic or variant == "uni":
        paths = list(line.fwd) if line.cyclic else _folded_edges(line)
        return [TransferStream(tuple(_uniform(paths, piece * (n - t), 1) for t in range(1, n)), c)]
    # bidi line: at step t link i -> i+1 carries the bundle of rank i-t+1 for ranks above i.
    ups, downs = [], []
    for t in range(1, n):
        ups.append(_step([Transfer(line.fwd[i], piece * (n - 1 - i)) for i in range(t - 1, n - 1)]))
        downs.append(_step([Transfer(line.bwd[i], piece * i) for i in range(n - t, 0, -1)]))
    return [TransferStream(tuple(ups), c), TransferStream(tuple(downs), c)]


def chains(line: Line, root: int, data: float, variant: str, reduce: bool) -> list[TransferStream]:
    """Broadcast from (reduce to) position ``root``: pipelined chains through every rank.

    Ring, uni: one chain all the way round (n-1 hops) with all the data. Ring, bidi: two chains
    round in opposite directions, each with half the data. Line: a chain up and a chain down
    from the root, each with all the data (either may be empty).
    """
    n = line.n
    if n < 2:
        return []
    c = line.copies
    if line.cyclic:
        if variant == "bidi":
            halves = [(1, data / 2), (-1, data / 2)]
        else:
            halves = [(1, data)]
        transfers = []
        for d, part in halves:
            if reduce:  # the chain starts next to the root on the far side and ends at the root
                transfers.append(Transfer(line.walk((root + d) % n, n - 1, d), part))
            else:
                transfers.append(Transfer(line.walk(root, n - 1, d), part))
        return [TransferStream((_step(transfers),), c)]
    up, down = n - 1 - root, root
    if reduce:
        transfers = [Transfer(line.walk(n - 1, up, -1), data), Transfer(line.walk(0, down, 1), data)]
    else:
        transfers = [Transfer(line.walk(root, up, 1), data), Transfer(line.walk(root, down, -1), data)]
    return [TransferStream((_step(transfers),), c)]


def shift(line: Line, data: float) -> list[TransferStream]:
    """Permute: every rank sends ``data`` to the next rank (the last one to the first)."""
    n = line.n
    if n < 2:
        return []
    paths = [line.fwd[i] if (line.cyclic or i + 1 < n) else line.path(n - 1, 0) for i in range(n)]
    return [TransferStream((_uniform(paths, data, 1),), line.copies)]


FLOW_CHUNKS = 16   # one-shot flows share links chunk by chunk; 1/16 of a flow keeps that within ~1%


def direct(flows: list[tuple[Path, float]], copies: int, min_chunk: float,
           pieces: int = FLOW_CHUNKS) -> list[TransferStream]:
    """One-shot: every flow at once, in chunks of 1/``pieces`` of the largest flow (many flows
    cross the same channels; coarse chunks would leave links idle between them), but none
    smaller than ``min_chunk`` (callers pass an eighth of a hop's bandwidth-delay product:
    finer than that the hop latency dominates anyway)."""
    biggest = max((b for _, b in flows), default=0.0)
    return [TransferStream((_step([Transfer(p, b) for p, b in flows]),), copies,
                   chunk_hint=max(biggest / pieces, min_chunk) if biggest else None)]
