"""Cumulative Prometheus histograms: deltas between scrapes, sums over series, quantiles.

A histogram is a map ``le -> cumulative count`` (``+Inf`` included) as exposed by
``<name>_bucket`` samples. Quantiles follow Prometheus' ``histogram_quantile``: find the bucket
holding the rank ``q x count`` and interpolate linearly inside it; a rank in the ``+Inf`` bucket
returns the largest finite bound, which is then only a lower bound of the quantile (``above_top``
tells; failure case F21a). Buckets of several series (engines of a data-parallel group, groups of
a deployment) are summed before the quantile, never averaged after it (failure case F9), and only
when every series has the same bucket bounds (failure case F21b: mid-rollout, an old and a new
engine may expose different buckets, and their sum would place observations in the wrong bucket).
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

    def __mul__(self, share: float) -> Histogram:
        """The observations scaled by ``share`` (a window's part of a longer span, at its rate)."""
        return Histogram({le: c * share for le, c in self.buckets.items()}, self.sum * share)

    def __add__(self, other: Histogram) -> Histogram:
        keys = set(self.buckets) | set(other.buckets)
        return Histogram({le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in keys},
                         self.sum + other.sum)


class LayoutMismatch(ValueError):
    """Series with different bucket bounds cannot be summed (failure case F21b)."""


def merge(histograms: Iterable[tuple[str, Histogram]]) -> Histogram:
    """Sum of several series' buckets, each given as ``(who, histogram)``. Raises
    ``LayoutMismatch`` naming two sources whose bucket bounds differ (and the bounds only one of
    them has); a histogram without buckets adds nothing."""
    total, first = Histogram(), None
    for who, h in histograms:
        if not h.buckets:
            continue
        if first is None:
            first = (who, frozenset(h.buckets))
        elif frozenset(h.buckets) != first[1]:
            only = sorted(frozenset(h.buckets) ^ first[1])
            raise LayoutMismatch(f"{first[0]} and {who} expose different bucket bounds "
                                 f"(only one of them has le={', '.join(_le(b) for b in only[:6])})")
        total = total + h
    return total


def _le(bound: float) -> str:
    return "+Inf" if bound == INF else f"{bound:g}"


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


def above_top(q: float, h: Histogram) -> bool:
    """The ``q`` quantile's rank lands in the ``+Inf`` bucket: the real quantile is above the
    largest finite bound, which ``quantile`` returns as a lower bound only (failure case F21a)."""
    finite = [b for b in h.buckets if b != INF]
    count = h.count
    return count > 0 and bool(finite) and h.buckets[max(finite)] < q * count


def mean(h: Histogram) -> float | None:
    """Mean observation (sum / count), or None when empty."""
    return h.sum / h.count if h.count > 0 else None
