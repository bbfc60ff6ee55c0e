"""Time-stamped samples over a sliding window: the one "last N seconds" of the autoscaler.

``Samples`` keeps ``(time, value)`` pairs in time order (times in seconds, added in
non-decreasing order) and answers the questions every windowed rule asks: the values since a
time (the highest recommendation of a stabilization window), the values up to a time (a forecast
made a lead time ago), the base a counter window is differenced against (the newest sample at or
before the window's start). Who keeps how much is the caller's rule: ``forget_before`` drops what
is older than a cutoff, ``forget_through`` also what sits exactly on it.

Used by the policy (recommendations, demand history, forecasts; autoscaler/policy/), the
pod-scrape metric source (scrapes of each leader; autoscaler/sources.py) and the kit's baselines
and fleet simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Samples(Generic[T]):
    """``(time, value)`` pairs, oldest first. Iterating yields the pairs."""

    def __init__(self) -> None:
        self._pairs: deque[tuple[float, T]] = deque()

    def add(self, at: float, value: T) -> None:
        """Append a sample at ``at`` seconds (not earlier than the last one)."""
        self._pairs.append((at, value))

    def forget_before(self, start: float) -> None:
        """Drop samples older than ``start`` (time < start)."""
        pairs = self._pairs
        while pairs and pairs[0][0] < start:
            pairs.popleft()

    def forget_through(self, end: float) -> None:
        """Drop samples at or before ``end`` (time <= end)."""
        pairs = self._pairs
        while pairs and pairs[0][0] <= end:
            pairs.popleft()

    def since(self, start: float) -> list[T]:
        """Values of the samples at or after ``start``, oldest first."""
        return [v for t, v in self._pairs if t >= start]

    def after(self, start: float) -> list[T]:
        """Values of the samples strictly after ``start``, oldest first."""
        return [v for t, v in self._pairs if t > start]

    def until(self, end: float) -> list[T]:
        """Values of the samples at or before ``end``, oldest first."""
        return [v for t, v in self._pairs if t <= end]

    def base(self, start: float) -> tuple[float, T] | None:
        """The sample a window starting at ``start`` is measured from: the newest one at or
        before ``start``, else the oldest (a history shorter than the window); None when empty."""
        found = self._pairs[0] if self._pairs else None
        for pair in self._pairs:
            if pair[0] > start:
                break
            found = pair
        return found

    def clear(self) -> None:
        self._pairs.clear()

    def __iter__(self) -> Iterator[tuple[float, T]]:
        return iter(self._pairs)

    def __reversed__(self) -> Iterator[tuple[float, T]]:
        return reversed(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)
