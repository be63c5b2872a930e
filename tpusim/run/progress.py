"""What `tpusim run` shows while it works: a tqdm progress bar with the phase, the records so far and their
rate on a terminal; nothing of the bar when stderr is no terminal (logs, CI, pipes), only the status lines.

Why tqdm: a bar users recognise, with the rate and elapsed time computed and drawn by a well-kept library
instead of hand-written carriage returns; it also keeps the status lines printed while it runs
(``say``) from tearing the bar.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

REFRESH_S = 0.2        # how often a counted phase's bar reads its counter


class _AboveBar:
    """sys.stdout while a bar is drawn on the same terminal: the script's own prints go above the bar
    instead of onto its line. Everything else is the real stdout's."""

    def __init__(self, out: TextIO, bar: tqdm) -> None:
        self._out, self._bar = out, bar
        self._pending = ""             # a line not yet ended: written with its newline, never under the bar

    def write(self, text: str) -> int:
        lines, _, self._pending = (self._pending + text).rpartition("\n")
        if lines or _:
            with self._bar.get_lock():
                self._bar.clear(nolock=True)
                self._out.write(lines + "\n")
                self._out.flush()
                self._bar.refresh(nolock=True)
        return len(text)

    def close_out(self) -> TextIO:
        """The real stdout back, with any unended line written."""
        if self._pending:
            self._out.write(self._pending)
        return self._out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


class Progress:
    """Status lines and one progress bar at a time, on ``stream`` (stderr); silent with ``quiet``."""

    def __init__(self, quiet: bool, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._bar: tqdm | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stdout: TextIO | None = None
        self._counting: str | None = None      # the phase ``count`` opened the bar for

    def say(self, text: str) -> None:
        """One status line ("tpusim: ..."), printed above the bar when one is drawn."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(f"tpusim: {text}", file=self.stream)
        else:
            print(f"tpusim: {text}", file=self.stream, flush=True)

    def __call__(self, text: str) -> None:
        """``say``: layers below the run (the TPU compiler's) take a Progress as a plain ``Callable[[str], None]``,
        and find ``count`` on it."""
        self.say(text)

    def _open(self, phase: str, unit: str, total: int | None, bar_format: str | None = None) -> tqdm | None:
        if self.quiet or not self.tty:
            return None
        # the size from shutil, which falls back to 100x20 where a terminal reports 0x0 (tqdm then draws nothing)
        columns, rows = shutil.get_terminal_size((100, 20))
        self._bar = tqdm(total=total, desc=f"tpusim: {phase}", unit=f" {unit}", file=self.stream,
                         ncols=columns, nrows=rows, leave=False, mininterval=REFRESH_S, bar_format=bar_format)
        return self._bar

    def track(self, phase: str, count: Callable[[], int], unit: str = "records") -> None:
        """Show ``phase`` with ``count()`` (read every REFRESH_S from another thread) and its rate until ``stop``."""
        bar = self._open(phase, unit, None)
        if bar is None:
            return
        self._stop.clear()
        if sys.stdout.isatty() and self.stream.isatty():        # the script prints on the bar's terminal
            self._stdout, sys.stdout = sys.stdout, _AboveBar(sys.stdout, bar)

        def loop() -> None:
            while not self._stop.wait(REFRESH_S):
                bar.n = count()
                bar.refresh()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def steps(self, phase: str, total: int, unit: str) -> None:
        """Show ``phase`` as ``total`` steps, advanced by ``advance``."""
        self._open(phase, unit, total)

    def count(self, phase: str, done: int, total: int, unit: str) -> None:
        """``phase``: ``done`` of ``total`` ``unit`` so far, as one line drawn over itself on a terminal
        ("tpusim: XLA: compiling 3 of 40 programs... [00:02<00:20]"): opened at 0, closed at ``total``. Off a
        terminal it draws nothing (the caller's status lines say when it starts and ends)."""
        if self._bar is None and done < total:
            self._counting = phase
            self._open(phase, unit, total, bar_format=f"{{desc}} {{n}} of {{total}} {unit}... "
                                                      "[{elapsed}<{remaining}]")
        if self._bar is not None and self._counting == phase:       # never another phase's bar
            self._bar.n = done
            self._bar.refresh()
            if done >= total:
                self.stop()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def stop(self) -> None:
        """Close the bar (it leaves no line behind); status lines print plainly again."""
        self._stop.set()
        if self._stdout is not None:
            if isinstance(sys.stdout, _AboveBar):
                sys.stdout.close_out()
            sys.stdout, self._stdout = self._stdout, None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._counting = None
