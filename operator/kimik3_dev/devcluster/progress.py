"""Progress lines for long dev-cluster steps (building, waiting for readiness).

``Progress.step("waiting for kwok")`` prints ``==> waiting for kwok``; ``tick(elapsed_s)``
updates an elapsed-seconds counter (in place on a terminal, one line every
``PLAIN_TICK_S`` seconds otherwise); the step ends with ``ok (1.2 s)`` or ``FAILED``. Step
durations are kept in ``timings`` (seconds, by step title) for the measurement report.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["Progress"]

PLAIN_TICK_S = 10.0
"""Seconds between "still waiting" lines when the output is not a terminal."""


class Progress:
    """Prints steps to ``out`` (stdout by default); ``quiet`` prints nothing."""

    def __init__(self, out: TextIO | None = None, quiet: bool = False) -> None:
        self.out = out or sys.stdout
        self.quiet = quiet
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.timings: dict[str, float] = {}
        self._title = ""
        self._last_plain = 0.0
        self.current = ""
        """Title of the step running now ("" between steps)."""

    def _write(self, text: str) -> None:
        if not self.quiet:
            self.out.write(text)
            self.out.flush()

    def note(self, text: str) -> None:
        """An indented detail line."""
        self._write(f"    {text}\n")

    @contextmanager
    def step(self, title: str) -> Iterator[Progress]:
        """A timed step; re-raises whatever the body raises after printing FAILED."""
        self._title, self._last_plain, self.current = title, 0.0, title
        self._write(f"==> {title}" + (" ..." if self.tty else "\n"))
        start = time.monotonic()
        try:
            yield self
        except BaseException:
            self._end(f"FAILED after {time.monotonic() - start:.1f} s")
            raise
        self.current = ""
        elapsed = time.monotonic() - start
        self.timings[title] = elapsed
        self._end(f"ok ({elapsed:.1f} s)")

    def _end(self, text: str) -> None:
        if self.tty:
            self._write(f"\r\033[K==> {self._title}: {text}\n")
        else:
            self._write(f"    {text}\n")

    def tick(self, elapsed_s: float) -> None:
        """Show that the current step is still running after ``elapsed_s`` seconds."""
        if self.tty:
            self._write(f"\r\033[K==> {self._title} ... {elapsed_s:4.0f} s")
        elif elapsed_s - self._last_plain >= PLAIN_TICK_S:
            self._last_plain = elapsed_s
            self._write(f"    ... {elapsed_s:.0f} s\n")
