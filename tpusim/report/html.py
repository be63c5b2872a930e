"""report.html: one self-contained page (figures embedded as base64 PNG) that opens offline.

Read at a glance: the headline cards and the verdict first, then the figures; every table (the per-mode
table with every row of the terminal summary, ops, grouped collectives, links, stalls) sits in a
collapsible <details> section, so no raw row has to be scrolled through. No script, no external file.

The page is templates/report.html rendered by Jinja2 with autoescaping: every value from the report is
escaped as text; this module turns the report's numbers into the strings the template shows.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from tpusim.report.model import incomplete_reason
from tpusim.report.schema import Headline, InferenceMode, MeasuredSection, ModeSection, Report
from tpusim.report.summary import budget_line, inference_lines, mode_rows, recorded_prefix, serving_head, warmup_lines
from tpusim.report.text import HFU_LABEL, MFU_LABEL, percent_text, seconds_text, slice_text, tflops_text
from tpusim.units import format_bytes

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{border:1px solid #ddd;border-radius:6px;padding:.7em 1em}
.card b{display:block;font-size:1.3em}.bad{color:#b00}table{border-collapse:collapse;font-size:.85em}
td,th{border-bottom:1px solid #eee;padding:.25em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
img{max-width:100%}.warn{background:#fff4e5;padding:.4em .8em;border-left:4px solid #f0a020;margin:.3em 0}
.verdict{background:#eef5ff;padding:.6em 1em;border-left:4px solid #3070d0;margin:1em 0}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}pre{background:#f6f6f6;padding:1em;overflow:auto}
"""
COLLECTIVE_GROUPS_SHOWN = 50
FIGURES = (("modes", "Step time per mode"), ("breakdown", "Time breakdown"), ("links", "ICI link utilisation"),
           ("roofline", "Roofline"), ("placements", "Placements"))
TEMPLATES = Environment(loader=PackageLoader("tpusim.report", "templates"), autoescape=True, undefined=StrictUndefined,
                        keep_trailing_newline=False)


def _image(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def headline_cards(mode: ModeSection, name: str) -> list[tuple[str, str]]:
    """The headline numbers of the fastest mode's steady-state step (tpusim/report/headline.py)."""
    head = mode.headline or Headline()
    step = seconds_text(mode.step_time_median_s) + f" ({name})" if mode.steps and mode.steps.count else \
        "no steps marked"
    cards = [("step time (steady median)", step)]
    if head.tokens_per_s_per_chip is not None:
        cards += [("tokens/s per chip", f"{head.tokens_per_s_per_chip:,.0f}"),
                  ("tokens/s per slice", f"{head.tokens_per_s_per_slice:,.0f}")]
    cards += [("TFLOP/s per chip", tflops_text(head.tflops_per_s_per_chip)),
              (HFU_LABEL, percent_text(mode.hfu)),
              *([(MFU_LABEL, percent_text(head.model_flops_utilisation))]
                if head.model_flops_utilisation is not None else []),
              ("HBM peak", f"{format_bytes(mode.hbm.peak_bytes)} of {format_bytes(mode.hbm.capacity_bytes)}"),
              ("exposed communication", percent_text(head.exposed_comm_share)),
              ("bound by", head.bound or "-")]
    return cards


def _serving(report: Report, best: str | None) -> InferenceMode | None:
    """The best mode's serving numbers when the program is an inference one that marked no training steps."""
    inference, mode = report.inference, report.modes.get(best) if best else None
    if inference is None or mode is None or best not in inference.modes or (mode.steps and mode.steps.count):
        return None
    return inference.modes[best]


def serving_cards(serving: InferenceMode) -> list[tuple[str, str]]:
    """TTFT, TPOT and tokens/s: the headline of an inference program (in place of "step time: no steps marked")."""
    return [("TTFT (prefill)", seconds_text(serving.ttft_s)), ("TPOT median", seconds_text(serving.tpot_median_s)),
            *([("tokens/s per chip", f"{serving.tokens_per_s_per_chip:,.0f}")]
              if serving.tokens_per_s_per_chip is not None else [])]


def serving_verdict(serving: InferenceMode) -> str:
    """The decode verdict, led by TTFT and TPOT (the summary's inference line says the same)."""
    return f"{serving_head(serving)}: {serving.verdict}"


def collective_groups(mode: ModeSection, ranks: int = 1) -> dict[str, Any] | None:
    """The grouped collectives' table (the first COLLECTIVE_GROUPS_SHOWN groups), or None without collectives;
    ``ranks`` recorded (--ranks all): the calls are then every process group's, where the page's header counts
    one rank's, and the table says so."""
    if not mode.collectives:
        return None
    groups = mode.collective_groups
    rows = [[g.kind, g.group_size, ",".join(g.axes), format_bytes(g.bytes), g.count, format_bytes(g.total_bytes),
             seconds_text(g.total_s), seconds_text(g.closed_form_total_s), seconds_text(g.contention_total_s),
             "/".join(g.algorithms), g.source] for g in groups[:COLLECTIVE_GROUPS_SHOWN]]
    return {"rows": rows, "count": len(groups), "calls": sum(g.count for g in groups),
            "more": max(0, len(groups) - COLLECTIVE_GROUPS_SHOWN),
            "scope": (f", counted over every process group of the {ranks} ranks recorded (the program's collectives "
                      f"count one rank's)") if ranks > 1 else ""}


def busiest_links(mode: ModeSection) -> dict[str, Any] | None:
    links = mode.links
    if links is None or not links.busiest:
        return None
    return {"busy": links.busy_links, "window": seconds_text(links.window_s), "simulated": links.simulated_links,
            "rows": [[b.link, percent_text(b.utilisation), format_bytes(b.bytes),
                      "yes" if b.simulated else "by symmetry"] for b in links.busiest]}


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def measured_context(measured: MeasuredSection) -> dict[str, Any]:
    """--target pjrt: real wall time per mode beside the prediction, and the two curves' ratios."""
    base = str(measured.baseline)
    why = {"device": "JAX's chip", "--chip": "--chip", "default": "the default chip"}.get(measured.chip_from, "")
    rows = [[m, r.steps, seconds_text(r.first_step_s), seconds_text(r.step_time_median_s),
             seconds_text(r.simulated_step_time_median_s), _ratio(r.ratio.measured), _ratio(r.ratio.simulated),
             seconds_text(r.total_s), f"{r.error.type} (exit {r.exit_code})" if r.error else ""]
            for m, r in measured.modes.items()]
    return {"platform": measured.platform, "device_kind": measured.device_kind, "jax_version": measured.jax_version,
            "chip": measured.chip, "why": why, "base": base, "notes": measured.notes, "rows": rows,
            "headers": ["mode", "steps", "first step", "step (median)", "simulated step", f"vs {base}, measured",
                        f"vs {base}, simulated", "total", "error"],
            "errors": [(m, r.error.traceback or "") for m, r in measured.modes.items() if r.error]}


def compiler_context(mode: ModeSection) -> dict[str, Any] | None:
    """The TPU compiler's section (tpusim/report/xla.py) in words and rows; None when no program was compiled."""
    xla = mode.xla
    if xla is None:
        return None
    if mode.compiler != "xla":
        return {"line": f"Not used: {xla.fell_back[0].split(': ', 1)[-1] if xla.fell_back else 'no program'}.",
                "rows": [], "fell_back": []}
    line = (f"{xla.programs} compiled graphs, {xla.executions} executions, {xla.kernels} kernels run: tpusim on "
            f"XLA's kernels {seconds_text(xla.priced_s)} (in the step time), XLA's own estimate "
            f"{seconds_text(xla.estimated_s)}, tpusim's model without the compiler {seconds_text(xla.model_s)}; "
            f"HBM peak {format_bytes(xla.hbm_peak_bytes)}.")
    return {"line": line,
            "rows": [[p.label, p.devices, p.executions, p.fusions, seconds_text(p.priced_s),
                      seconds_text(p.estimated_s), seconds_text(p.model_s),
                      f"{p.compile_s:.1f} s" + (" (cached)" if p.cached else "")] for p in xla.per_program],
            "fell_back": xla.fell_back}


def render_html(report: Report, figures: dict[str, Path]) -> str:
    """report.html from templates/report.html (Jinja2, autoescaped): one page, figures embedded."""
    run, modes = report.run, report.modes
    where = slice_text(run.topology, report.slice.slices)
    cards = [("script", run.script), ("slice", f"{where} on {report.chip.display_name}"),
             ("chips", str(report.slice.chips))]
    best = min(modes, key=lambda m: modes[m].time_s) if modes else None
    summary = modes[best] if best else None
    serving = _serving(report, best)
    verdict = summary.headline.verdict if summary is not None and summary.headline else None
    if serving is not None:                  # an inference program leads with what a serving engineer came for
        cards += serving_cards(serving) + headline_cards(summary, str(best))[1:]
        verdict = serving_verdict(serving)
    elif summary is not None:
        cards += headline_cards(summary, str(best))
    names = list(modes)
    placements = report.placements
    context = {
        "style": Markup(STYLE), "script": run.script, "best": best, "cards": cards,
        "incomplete": incomplete_reason(report), "traceback": report.error.traceback if report.error else None,
        "budget": budget_line(report),              # the record budget (TPUSIM_MAX_RECORDS, --max-records)
        "shape_note": report.slice.shape_note,
        "verdict": verdict,
        "warmup": warmup_lines(modes), "warnings": report.warnings,
        "mode_headers": ["", *names],
        "mode_table": [[label, *values] for label, values in mode_rows(modes, names, recorded_prefix(report),
                                                                        report.inference)],
        "inference": inference_lines(report.inference),     # the KV cache, what fits, each mode's decode verdict
        "measured": measured_context(report.measured) if report.measured else None,
        "figures": [{"name": name, "title": title, "image": _image(figures[name]) if name in figures else None}
                    for name, title in FIGURES],
        "links": busiest_links(summary) if summary is not None else None,
        "groups": collective_groups(summary, report.program.ranks_recorded) if summary is not None else None,
        "placements": None if placements is None or not placements.ranked else {
            "reason": placements.reason,
            "rows": [[p.placement + (" (default)" if p.placement == placements.default else ""),
                      seconds_text(p.step_s), seconds_text(p.collective_s)] for p in placements.ranked]},
        "top_ops": [[o.op, o.source, o.count, seconds_text(o.seconds), f"{o.flops:.3g}", format_bytes(o.bytes), o.bound]
                    for o in summary.top_ops] if summary is not None else [],
        "stalls": [[s.reason, s.source, seconds_text(s.seconds)] for s in summary.host_stalls]
        if summary is not None else [],
        "xla": compiler_context(summary) if summary is not None else None,
    }
    return TEMPLATES.get_template("report.html").render(context)
