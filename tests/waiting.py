"""Bounded polling for tests: the one ``wait_for`` every test module uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(fn: Callable[[], Any], timeout: float = 20.0, what: str = "condition", interval: float = 0.2) -> Any:
    """Call ``fn`` every ``interval`` seconds until it returns something truthy (returned), or
    fail after ``timeout`` seconds naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value {last!r}")
