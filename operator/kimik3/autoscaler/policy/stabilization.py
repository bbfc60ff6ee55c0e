"""Stabilization and bounds: from each decision's recommendation to the levels the fleet may move to.

Scale-up takes the highest recommendation of ``scale_up_window_s``, scale-down the highest of
``scale_down_window_s`` (Kubernetes HPA semantics) at the ``scale_down_headroom`` level, only once
the policy has a whole window of history (nothing scales down on an operator restart), never
while the observed quantile is over that level (latency.py), and never to a count the observed
quantile says passes it (reaction.py); bounded by min/max. Groups asked for while the target
holds (within the reaction's tolerance), or beyond what the demand now needs (a forecast), are
added only as far as the recommendations of a whole window agree (``sustained``: a group costs a
load time of GPU-hours); a broken target gets one group more at once, a saturated fleet its panic
estimate (latency.py). What a whole window agreed on is also what a burst measures as its need
(bursts.py).

No reading -> hold (never scale down). "No traffic" is a reading: with ``min_replicas = 0`` the
fleet goes to zero once the whole scale-down window saw none (F11).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimik3.autoscaler.window import Samples


@dataclass
class Stabilization:
    """The recommendations of the last windows, and the bounds. Times in seconds; levels in groups."""

    min_replicas: int
    """``LatencyPolicySettings.min_replicas`` (0: scale to zero)."""
    max_replicas: int
    """``LatencyPolicySettings.max_replicas``."""
    up_window_s: float
    """``LatencyPolicySettings.scale_up_window_s``."""
    down_window_s: float
    """``LatencyPolicySettings.scale_down_window_s``."""
    _recommendations: Samples[tuple[int, int]] = field(default_factory=Samples)
    """(scale-up level, scale-down level) of each decision with a reading."""
    _first_decision: float | None = None
    _last_traffic: float | None = None

    def start(self, now: float) -> None:
        """A decision at ``now``: the first one starts the history."""
        if self._first_decision is None:
            self._first_decision = now

    def warmed(self, now: float) -> bool:
        """A whole scale-down window has passed since the first decision (scale-down may follow)."""
        return self._first_decision is not None and now - self._first_decision >= self.down_window_s

    def without_traffic(self, now: float, current: int) -> tuple[int, str]:
        """Recommendation and reason for a window with no traffic, ``current`` groups asked for:
        ``min_replicas``, unless that is 0 and traffic was seen within the scale-down window
        (then at least one group)."""
        if self.min_replicas == 0 and self._last_traffic is not None and now - self._last_traffic < self.down_window_s:
            return max(current, 1), "RecentTraffic"
        return self.min_replicas, "NoTraffic"

    def traffic(self, now: float) -> None:
        """The window ending ``now`` had traffic."""
        self._last_traffic = now

    def record(self, now: float, rec: int, rec_down: int, window_s: float) -> tuple[int, int]:
        """Keep a decision's (scale-up, scale-down) recommendation, bounded by min/max, for the
        longest of the two windows and the observation's ``window_s``; returns it bounded."""
        rec = min(max(rec, self.min_replicas), self.max_replicas)
        rec_down = min(max(rec_down, self.min_replicas), self.max_replicas)
        self._recommendations.add(now, (rec, rec_down))
        self._recommendations.forget_before(now - max(self.up_window_s, self.down_window_s, window_s))
        return rec, rec_down

    def levels(self, now: float) -> tuple[int, int]:
        """(the highest scale-up recommendation of the scale-up window, the highest scale-down
        one of the scale-down window)."""
        up = max(r for r, _ in self._recommendations.since(now - self.up_window_s))
        down = max(r for _, r in self._recommendations.since(now - self.down_window_s))
        return up, down

    def sustained(self, now: float, window_s: float, interval_s: float) -> int | None:
        """The most groups the scale-up recommendations of a whole observation window (``window_s``,
        less one ``interval_s`` between decisions, back from ``now``) all asked for: their lowest,
        from the newest one at or before that window's start on. None while the history is
        shorter than that window."""
        start = now - (window_s - interval_s) + 1e-6
        base = self._recommendations.base(start)
        if base is None or base[0] > start:
            return None
        return min(r for t, (r, _) in self._recommendations if t >= base[0])

    def agreed(self, now: float, current: int, window_s: float, interval_s: float) -> bool:
        """The recommendations have asked for more than ``current`` groups for a whole
        observation window (``sustained``)."""
        level = self.sustained(now, window_s, interval_s)
        return level is not None and level > current
