"""The ``python -m tpusim chips`` table: key numbers per generation, then the documents behind them.

Numbers come from the chip TOML files (tpusim.hardware.spec), never from here; a value that is an estimate
rather than a published figure is marked with ``~`` so nobody mistakes it for a spec sheet number.
"""

from __future__ import annotations

from collections.abc import Callable

from tpusim.errors import TpusimError
from tpusim.hardware.spec import ChipSpec, available_chips, chip_sources, chips_dir, is_estimate, load_chip

ESTIMATE_MARK = "~"

# (header, field whose source decides the ~ mark, how to print it, right-align?)
_Column = tuple[str, str, Callable[[ChipSpec], str], bool]
_COLUMNS: list[_Column] = [
    ("chip", "name", lambda c: c.name, False),
    ("generation", "display_name", lambda c: c.display_name, False),
    ("bf16 TFLOP/s", "peak_bf16_flops_per_s", lambda c: f"{c.peak_bf16_flops_per_s / 1e12:.0f}", True),
    ("HBM GiB", "hbm_bytes", lambda c: f"{c.hbm_bytes / 2**30:.0f}", True),
    ("HBM GB/s", "hbm_bytes_per_s", lambda c: f"{c.hbm_bytes_per_s / 1e9:.0f}", True),
    ("ICI GB/s/link", "ici_link_bytes_per_s", lambda c: f"{c.ici_link_bytes_per_s / 1e9:.0f}", True),
    ("ports", "ici_ports_per_chip", lambda c: str(c.ici_ports_per_chip), True),
    ("torus", "torus_dims", lambda c: f"{c.torus_dims}D", True),
    ("SparseCores", "sparsecores_per_chip", lambda c: str(c.sparsecores_per_chip), True),
    ("max slice", "max_slice_shape", lambda c: _shape(c.max_slice_shape), False),
]


def loadable_chips() -> tuple[list[ChipSpec], list[str]]:
    """Every chip file of the folder that loads, and one line per file that does not (issue 32, row 9: one
    broken file made `tpusim chips` list nothing)."""
    chips, problems = [], []
    for name in available_chips():
        try:
            chips.append(load_chip(name))
        except TpusimError as error:
            problems.append(f"skipped {name}: {error}")
    return chips, problems


def format_chips_table() -> str:
    """One row per chip file, a legend, and a numbered list of the documents the values come from; a file that
    does not load is one line at the end."""
    chips, problems = loadable_chips()
    if not chips:
        return "\n".join([f"no chip files found in {chips_dir()}", *problems])
    names = [chip.name for chip in chips]
    sources = {name: chip_sources(name) for name in names}

    # every cell ends in the mark or a space, so right-aligned numbers stay aligned on their digits
    rows = [[header + " " for header, *_ in _COLUMNS]]
    for chip in chips:
        rows.append([fmt(chip) + (ESTIMATE_MARK if is_estimate(sources[chip.name].get(field, "")) else " ")
                     for _, field, fmt, _ in _COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [" ".join(cell.rjust(width) if right else cell.ljust(width)
                       for cell, width, (*_, right) in zip(row, widths, _COLUMNS, strict=True)).rstrip()
             for row in rows]
    lines.append(f"ICI GB/s/link is one way, one link. {ESTIMATE_MARK} = estimate (no public figure); "
                 f"every value's source or reasoning: {chips_dir()}/<chip>.toml")
    lines.append("")
    lines.extend(_sources_lines(names, sources))
    lines.extend(problems)
    return "\n".join(lines)


def _shape(shape: tuple[int, ...]) -> str:
    chips = 1
    for axis in shape:
        chips *= axis
    return f"{'x'.join(map(str, shape))} ({chips} chips)"


def _sources_lines(names: list[str], sources: dict[str, dict[str, str]]) -> list[str]:
    """Documents numbered once across all chips; each chip lists the numbers it uses."""
    documents: list[str] = []
    used: dict[str, list[int]] = {}
    for name in names:
        used[name] = []
        for text in sources[name].values():
            if is_estimate(text):
                continue
            document = source_document(text)
            if document not in documents:
                documents.append(document)
            number = documents.index(document) + 1
            if number not in used[name]:
                used[name].append(number)
    lines = ["Sources:"]
    lines += [f"  [{number}] {document}" for number, document in enumerate(documents, start=1)]
    width = max(len(name) for name in names)
    for name in names:
        estimates = sum(is_estimate(text) for text in sources[name].values())
        cited = " ".join(f"[{number}]" for number in sorted(used[name]))
        total = len(sources[name])
        lines.append(f"  {name.ljust(width)}  {cited}; {estimates} of {total} values are estimates")
    return lines


def source_document(text: str) -> str:
    """The document a source names: the text before the first comma outside parentheses."""
    depth = 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            return text[:index].strip()
    return text.strip()
