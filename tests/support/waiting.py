"""Bounded polling: the one ``wait_for`` every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``wait_for`` ran out of time (an AssertionError, so pytest reports it as a failed check)."""


def wait_for(fn: Callable[[], T], timeout: float = 20.0, what: str = "condition", *, interval: float = 0.2,
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``fn`` every ``interval`` seconds until it returns something truthy, and return that.

    ``timeout`` bounds the wait, seconds; then ``WaitTimeout`` names ``what`` and the last value.
    An exception of ``retry_on`` counts as "not yet" (kept as the last value, e.g. while the API
    server restarts); any other exception ends the wait at once, so ``fn`` can fail fast on a state
    that will never change (a process that exited)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}; last value {last!r}")
        time.sleep(interval)
