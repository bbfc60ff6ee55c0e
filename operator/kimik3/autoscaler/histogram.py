"""Cumulative Prometheus histograms: deltas between scrapes, sums over series, quantiles.

A histogram is a map ``le -> cumulative count`` (``+Inf`` included) as exposed by
``<name>_bucket`` samples. Quantiles follow Prometheus' ``histogram_quantile``: find the bucket
holding the rank ``q x count`` and interpolate linearly inside it; a rank in the ``+Inf`` bucket
returns the largest finite bound. Buckets of several series (engines of a data-parallel group,
groups of a deployment) are summed before the quantile, never averaged after it (failure case F9).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

INF = math.inf


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts keyed by upper bound (seconds for latency histograms)."""

    buckets: Mapping[float, float] = field(default_factory=dict)
    sum: float = 0.0

    @property
    def count(self) -> float:
        return self.buckets.get(INF, max(self.buckets.values(), default=0.0))

    def __sub__(self, older: Histogram) -> Histogram:
        """Observations made between ``older`` and this scrape of the same series. A counter
        reset (a restarted engine: some bucket went down) yields this histogram as it is."""
        if any(self.buckets.get(le, 0.0) < older.buckets.get(le, 0.0) for le in older.buckets):
            return self
        return Histogram({le: c - older.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                         self.sum - older.sum)

    def __add__(self, other: Histogram) -> Histogram:
        keys = set(self.buckets) | set(other.buckets)
        return Histogram({le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in keys},
                         self.sum + other.sum)


def merge(histograms: Iterable[Histogram]) -> Histogram:
    """Sum of several series' buckets (same bucket layout expected; missing bounds count 0)."""
    total = Histogram()
    for h in histograms:
        total = total + h
    return total


def quantile(q: float, h: Histogram) -> float | None:
    """The ``q`` quantile (0 < q < 1) of ``h``, or None when it holds no observation."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), not {q}")
    bounds = sorted(h.buckets)
    count = h.count
    if count <= 0 or not bounds:
        return None
    rank = q * count
    prev_bound, prev_count = 0.0, 0.0
    for le in bounds:
        c = h.buckets[le]
        if c >= rank:
            if le == INF:
                finite = [b for b in bounds if b != INF]
                return finite[-1] if finite else None
            if c == prev_count:
                return le
            return prev_bound + (le - prev_bound) * (rank - prev_count) / (c - prev_count)
        prev_bound, prev_count = le, c
    return bounds[-1] if bounds[-1] != INF else None


def mean(h: Histogram) -> float | None:
    """Mean observation (sum / count), or None when empty."""
    return h.sum / h.count if h.count > 0 else None
