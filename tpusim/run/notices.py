"""Notes a user needs once, not on every run: whether one was already said is remembered in tpusim's cache
(``~/.cache/tpusim/notices/<key>``, $XDG_CACHE_HOME honoured), so the next run stays quiet about it.

Why: "the TPU compiler is not used: libtpu is not installed" is advice (the xla extra prices programs as the
real compiler builds them); said after every run it becomes noise a reader learns to skip, with the lines
around it. report.html and report.json keep saying it: a report stands alone.
"""

from __future__ import annotations

from pathlib import Path

from tpusim.output import cache_dir


def _marker(key: str) -> Path:
    return cache_dir("notices") / key


def first_time(key: str) -> bool:
    """True the first time ``key`` is asked on this machine (and remembers it); False after. A cache that cannot
    be written (read-only home) says True every time: better said again than never."""
    marker = _marker(key)
    if marker.exists():
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
    return True


def once(lines: list[str], reason: str | None, key: str) -> list[str]:
    """``lines`` without those that give ``reason`` when it was said before (``key``); as they are otherwise. The
    note counts as said only when a line gives it."""
    if not reason or not any(reason in line for line in lines) or first_time(key):
        return lines
    return [line for line in lines if reason not in line]
