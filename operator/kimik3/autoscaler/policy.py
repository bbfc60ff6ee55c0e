"""Decode-latency policy: how many groups keep the per-token latency under target.

The policy's model of one group: per-token latency at ``c`` concurrent requests is
``t(c) = t0 + k x c`` seconds (decode slows linearly with batch: step time grows with the batch's
tokens while the per-step cost of weights is shared; see sim/perfmodel.py for the calibration).
At the latency target ``T`` (times a headroom < 1) a group holds at most
``c_max = (T x headroom - t0) / k`` requests, and then produces ``c_max / T`` tokens/s. The fleet
demand is the token rate users ask for: observed output tokens/s, scaled up by the queue
(``(running + waiting) / running``) since a saturated fleet's throughput understates demand.
Desired groups = ``ceil(predicted demand / (c_max / T))``.

- Learned online: ``(t0, k)`` start at the recipe's profile (the seed) and follow each window's
  observation (per-group concurrency, per-token latency quantile) by exponentially weighted least
  squares, regularised toward the seed so one noisy window cannot swing it.
- Ahead of the SLO: demand is extrapolated by its recent trend over the time a new group needs to
  load, so a ramp adds groups before latency breaks, and by more than one step when needed.
- Stabilization: scale-up takes the highest recommendation of ``scale_up_window_s``, scale-down
  the highest of ``scale_down_window_s`` (Kubernetes HPA semantics), bounded by min/max.
- Groups still loading are counted as coming; while one loads no further scale-up happens
  (failure case F10). Groups that cannot be placed are not counted as capacity, and adding more
  cannot help: the policy holds and says so.
- No reading -> hold (never scale down). "No traffic" is a reading: with ``min_replicas = 0`` the
  fleet goes to zero once the whole scale-down window saw none (F11).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from kimik3.autoscaler.observation import DecodeObservation


@dataclass(frozen=True)
class FleetState:
    """Groups as the cluster reports them."""

    current: int
    """Groups asked for (LeaderWorkerSet spec.replicas)."""
    ready: int
    """Groups serving."""
    loading: int = 0
    """Groups created, not yet ready, still inside their load timeout (coming)."""
    unplaceable: int = 0
    """Groups whose pods the scheduler cannot place (never coming on their own)."""


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    """CamelCase reason, also used in Events and status.lastScale."""
    message: str = ""
    recommendation: int | None = None
    """The unstabilized recommendation, for observability."""


class Policy(Protocol):
    """Anything that turns (time, observation or None, fleet) into a Decision."""

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision: ...


@dataclass
class GroupLatencyModel:
    """``t(c) = t0 + k c`` per-token seconds at ``c`` requests per group, fitted online.

    Exponentially weighted least squares with forgetting factor ``forget`` per observation and a
    prior of weight ``prior_weight`` pseudo-observations at the seed, placed at concurrencies 1
    and ``seed_c`` so the prior pins both intercept and slope."""

    t0: float
    k: float
    seed_c: float = 32.0
    forget: float = 0.9
    prior_weight: float = 2.0
    _n: float = 0.0
    _sc: float = 0.0
    _sy: float = 0.0
    _scc: float = 0.0
    _scy: float = 0.0

    def __post_init__(self) -> None:
        self._seed = (self.t0, self.k)

    def latency(self, c: float) -> float:
        return self.t0 + self.k * c

    def capacity(self, latency_s: float) -> float:
        """Largest concurrency per group whose latency stays <= ``latency_s`` (0 if none)."""
        if latency_s <= self.t0:
            return 0.0
        return (latency_s - self.t0) / self.k if self.k > 0 else math.inf

    def update(self, c: float, y: float) -> None:
        if c <= 0 or y <= 0 or not math.isfinite(y):
            return
        f = self.forget
        self._n, self._sc, self._sy = f * self._n + 1, f * self._sc + c, f * self._sy + y
        self._scc, self._scy = f * self._scc + c * c, f * self._scy + c * y
        t0s, ks = self._seed
        w = self.prior_weight / 2
        n = self._n + 2 * w
        sc = self._sc + w * (1 + self.seed_c)
        sy = self._sy + w * ((t0s + ks) + (t0s + ks * self.seed_c))
        scc = self._scc + w * (1 + self.seed_c ** 2)
        scy = self._scy + w * ((t0s + ks) + self.seed_c * (t0s + ks * self.seed_c))
        det = n * scc - sc * sc
        if det <= 1e-12:
            return
        k = (n * scy - sc * sy) / det
        t0 = (sy - k * sc) / n
        # Physical bounds: latency cannot fall with load, and batch-1 latency stays positive.
        self.k = max(k, ks * 0.1)
        self.t0 = max(t0, t0s * 0.25)


@dataclass
class LatencyPolicySettings:
    target_s: float
    """Per-token latency target (seconds) at ``percentile``."""
    percentile: float = 0.9
    min_replicas: int = 1
    max_replicas: int = 1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    headroom: float = 0.85
    """Plan for this share of the target, so normal variance stays under it."""
    lead_s: float = 600.0
    """How far ahead demand is extrapolated: about the time a new group takes to load."""
    trend_window_s: float = 300.0
    """Demand history used for the trend."""
    metric: str = "timePerOutputToken"
    """timePerOutputToken (per token) or interTokenLatency (raw vLLM ITL per engine step)."""


@dataclass
class LatencyPolicy:
    """kimik3's policy (module docstring). One instance per deployment: it keeps the history."""

    settings: LatencyPolicySettings
    model: GroupLatencyModel
    _recommendations: deque = field(default_factory=deque)
    _demand: deque = field(default_factory=deque)
    _last_traffic: float | None = None

    def _latency(self, obs: DecodeObservation) -> float | None:
        q = self.settings.percentile
        if self.settings.metric == "interTokenLatency":
            return obs.step_latency_quantile(q)
        return obs.token_latency_quantile(q)

    def _record(self, now: float, value: float, history: deque, window: float) -> None:
        history.append((now, value))
        while history and history[0][0] < now - window:
            history.popleft()

    def _predicted_demand(self, now: float, demand: float) -> float:
        self._record(now, demand, self._demand, self.settings.trend_window_s)
        pts = list(self._demand)
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < 30:
            return demand
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        md = sum(d for _, d in pts) / n
        var = sum((t - mt) ** 2 for t, _ in pts)
        slope = sum((t - mt) * (d - md) for t, d in pts) / var if var > 0 else 0.0
        return max(demand, demand + slope * self.settings.lead_s)

    def recommend(self, now: float, obs: DecodeObservation, fleet: FleetState) -> tuple[int, str]:
        """Unstabilized recommendation and its reason."""
        s = self.settings
        if not obs.has_traffic:
            if s.min_replicas == 0 and self._last_traffic is not None and now - self._last_traffic < s.scale_down_window_s:
                return max(fleet.current, 1), "RecentTraffic"
            return s.min_replicas, "NoTraffic"
        self._last_traffic = now
        serving = max(1, fleet.ready)
        per_group_c = obs.running / serving
        latency = self._latency(obs)
        if latency is not None and per_group_c > 0:
            self.model.update(per_group_c, latency if s.metric != "interTokenLatency" else latency)
        tokens_per_s = obs.generation_tokens / obs.window_s if obs.window_s > 0 else 0.0
        queue_factor = (obs.running + obs.waiting) / obs.running if obs.running > 0 else 1.0
        demand = tokens_per_s * queue_factor
        if demand <= 0 and obs.running + obs.waiting > 0:
            # Requests present but no finished tokens in the window: size by concurrency.
            c_max = self.model.capacity(s.target_s * s.headroom)
            return (math.ceil((obs.running + obs.waiting) / c_max) if c_max > 0 else s.max_replicas), "Concurrency"
        predicted = self._predicted_demand(now, demand)
        c_max = self.model.capacity(s.target_s * s.headroom)
        if c_max <= 0:
            return s.max_replicas, "TargetBelowBatch1Latency"
        per_group_tokens = c_max / (s.target_s * s.headroom)
        n = math.ceil(predicted / per_group_tokens - 1e-9)
        reason = "Predicted" if predicted > demand * 1.05 else "Load"
        if latency is not None and latency > s.target_s and n <= fleet.current:
            n, reason = fleet.current + 1, "OverTarget"  # the model lags reality: react anyway
        return n, reason

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        s = self.settings
        if obs is None:
            return Decision(fleet.current, "MetricsUnavailable", "no reading: holding replicas")
        rec, why = self.recommend(now, obs, fleet)
        rec = min(max(rec, s.min_replicas), s.max_replicas)
        window = max(s.scale_up_window_s, s.scale_down_window_s)
        self._record(now, rec, self._recommendations, window)
        up = max(r for t, r in self._recommendations if t >= now - s.scale_up_window_s)
        down = max(r for t, r in self._recommendations if t >= now - s.scale_down_window_s)
        latency = self._latency(obs)
        detail = (f"p{int(s.percentile * 100)} {'ITL' if s.metric == 'interTokenLatency' else 'TPOT'} "
                  f"{latency * 1000:.2f} ms" if latency is not None else "no latency samples")
        detail += f", {obs.running:.0f} running, {obs.waiting:.0f} waiting, recommendation {rec} ({why})"
        if up > fleet.current:
            if fleet.unplaceable > 0:
                return Decision(fleet.current, "Unplaceable",
                                f"{fleet.unplaceable} group(s) cannot be placed: not adding more; {detail}", rec)
            if fleet.loading > 0:
                return Decision(fleet.current, "GroupsLoading",
                                f"{fleet.loading} group(s) still loading count as coming; {detail}", rec)
            return Decision(up, "ScaleUp" if why != "Predicted" else "ScaleUpPredicted", detail, rec)
        if down < fleet.current:
            return Decision(down, "ScaleDown" if down > 0 else "ScaledToZero", detail, rec)
        return Decision(fleet.current, "Hold", detail, rec)
