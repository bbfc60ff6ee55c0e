"""Decode-latency policy: how many groups keep the per-token latency under target.

The policy's model of one group: the target's latency quantile (P90 per token by default) at a
mean of ``c`` requests running per group is ``t(c) = t0 + k x c`` seconds, a line local to the
target (seeded in autoscaler/seed.py from the perf model with Poisson batches, learned online).
A group holds ``c_max = headroom x (T - t0) / k`` requests at the target ``T``, and produces
``c_max / mean latency`` tokens/s, the mean latency being ``T / percentile_to_mean`` (Little's
law). The fleet demand is the token rate users ask for: observed output tokens/s, scaled up by
the queue (``(running + waiting) / running``); when the fleet is saturated (quantile > 1.5 T) also
at least the requests running now at the current latency (the window lags a level shift).
Desired groups = ``ceil(predicted demand / per-group tokens/s)``.

- Learned online: each window gives ``c`` by Little's law (tokens/s x mean per-token latency from
  the ITL histogram's sum / count, per serving group; the running gauge when no sum is known)
  and the quantile; ``(t0, k)`` follow by exponentially weighted least squares regularised toward
  the seed, only from windows near the target (0.5-1.5 T) and without a group joining inside the
  window; the quantile/mean ratio follows by an exponential average.
- Ahead of the SLO: demand is extrapolated over the lead time (at least ``lead_s``, raised to the
  load time the policy observes from its own scale-ups) along a trend that is significant (t >=
  ``trend_t``) and sustained (both halves of the history rise: not noise, not a past step).
- Stabilization: scale-up takes the highest recommendation of ``scale_up_window_s``, scale-down
  the highest of ``scale_down_window_s`` (Kubernetes HPA semantics), and only once the policy has
  a whole window of history (nothing scales down on an operator restart), and never to a count
  where the observed latency plus the model's slope over the load each group takes over would
  pass 0.9 T; bounded by min/max.
- Groups still loading are counted as coming: they are not cancelled, and while one loads no
  scale-up follows from latency (failure case F10); a higher DEMAND (which does not compound
  with the groups' count) may still add groups. The latency reaction (one more group when the
  quantile is over 1.1 T and the model says enough) only runs with nothing loading. Groups that
  cannot be placed are not counted as capacity, and adding more cannot help: the policy holds
  and says so.
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
    """Per-token latency of one group of ``n`` serving a mean of ``c`` requests each.

    The latency of a step is linear in its batch (the perf model near the target):
    ``t(b) = t0 + k b``. A group's batch is not its mean ``c``: the fleet's requests come and go at
    random (Poisson in number, mean ``n c``) and the router spreads them over ``n`` groups, so a
    group's batch varies around ``c`` with a standard deviation ``sqrt(c / n)``. The token-weighted
    quantile the target is written in (P90) sits ``z`` standard deviations above the mean, and the
    token-weighted mean at ``c + w / n`` (a token is more likely emitted in a large batch: the
    mean of the token-weighted batch of a Poisson total shared by ``n`` is ``c + 1 / n``)::

        quantile(c, n) = t0 + k (c + z sqrt(c / n))        mean(c, n) = t0 + k (c + w / n)

    ``z = w = 0`` is a plain line in ``c``. Fitted online: exponentially weighted least squares of
    ``t`` on the effective batch (both points of every window: the quantile and the mean), with
    forgetting factor ``forget`` per window and a prior of ``prior_weight`` pseudo-observations on
    the seed line at effective batches ``seed_c_low`` and ``seed_c`` (the range the seed was fitted
    on), so the prior pins both intercept and slope where the policy works."""

    t0: float
    k: float
    seed_c: float = 32.0
    forget: float = 0.9
    prior_weight: float = 2.0
    seed_c_low: float = 1.0
    z: float = 0.0
    """Standard deviations of a group's batch between its mean and the target's quantile."""
    w: float = 0.0
    """Extra batch of the token-weighted mean, times the number of groups (1 for Poisson)."""
    _n: float = 0.0
    _sc: float = 0.0
    _sy: float = 0.0
    _scc: float = 0.0
    _scy: float = 0.0

    def __post_init__(self) -> None:
        self._seed = (self.t0, self.k)

    def quantile_batch(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        return c + (self.z + extra_z) * math.sqrt(max(c, 0.0) / max(n, 1))

    def mean_batch(self, c: float, n: int = 1) -> float:
        return c + self.w / max(n, 1)

    def latency(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        """The target's quantile at ``c`` requests per group, ``n`` groups (``extra_z`` more
        standard deviations of the batch: a margin for the minute-to-minute variation)."""
        return self.t0 + self.k * self.quantile_batch(c, n, extra_z)

    def mean_latency(self, c: float, n: int = 1) -> float:
        return self.t0 + self.k * self.mean_batch(c, n)

    def capacity(self, latency_s: float, n: int = 1) -> float:
        """Largest concurrency per group whose quantile stays <= ``latency_s`` (0 if none)."""
        if latency_s <= self.t0:
            return 0.0
        if self.k <= 0:
            return math.inf
        x = (latency_s - self.t0) / self.k
        a = self.z / math.sqrt(max(n, 1))
        u = (-a + math.sqrt(a * a + 4 * x)) / 2  # c = u^2 solves u^2 + a u = x
        return u * u

    def concurrency(self, demand: float, n: int) -> float:
        """Requests per group when ``n`` groups serve ``demand`` tokens/s (per step for a per-step
        model): Little's law ``n c = demand x mean(c, n)`` solved for ``c``. Infinite when the
        groups cannot keep up (``n <= demand x k``): the line's queueing term ``1 / (1 - rho)``."""
        if demand <= 0:
            return 0.0
        spare = n - demand * self.k
        if spare <= 0:
            return math.inf
        return demand * (self.t0 + self.k * self.w / n) / spare

    def predict(self, demand: float, n: int, extra_z: float = 0.0) -> float:
        """The quantile ``n`` groups give at ``demand`` (infinite past saturation)."""
        if n <= 0:
            return math.inf if demand > 0 else 0.0
        c = self.concurrency(demand, n)
        return math.inf if math.isinf(c) else self.latency(c, n, extra_z)

    def groups_for(self, demand: float, latency_s: float, most: int, extra_z: float = 0.0) -> int | None:
        """Fewest groups (1..``most``) whose predicted quantile at ``demand`` is <= ``latency_s``;
        None if even ``most`` do not."""
        for n in range(1, most + 1):
            if self.predict(demand, n, extra_z) <= latency_s:
                return n
        return None

    def update(self, c: float, y: float, n: int = 1, mean: float | None = None) -> None:
        """One window: quantile ``y`` (and the mean latency, when known) at ``c`` requests per group
        over ``n`` groups."""
        if c <= 0 or y <= 0 or not math.isfinite(y):
            return
        points = [(self.quantile_batch(c, n), y)]
        if mean is not None and mean > 0 and math.isfinite(mean):
            points.append((self.mean_batch(c, n), mean))
        f = self.forget
        self._n, self._sc, self._sy, self._scc, self._scy = (f * self._n, f * self._sc, f * self._sy,
                                                             f * self._scc, f * self._scy)
        for x, v in points:
            self._n += 1
            self._sc += x
            self._sy += v
            self._scc += x * x
            self._scy += x * v
        t0s, ks = self._seed
        w = self.prior_weight / 2
        lo, hi = self.seed_c_low, self.seed_c
        n_ = self._n + 2 * w
        sc = self._sc + w * (lo + hi)
        sy = self._sy + w * ((t0s + ks * lo) + (t0s + ks * hi))
        scc = self._scc + w * (lo ** 2 + hi ** 2)
        scy = self._scy + w * (lo * (t0s + ks * lo) + hi * (t0s + ks * hi))
        det = n_ * scc - sc * sc
        if det <= 1e-12:
            return
        k = (n_ * scy - sc * sy) / det
        t0 = (sy - k * sc) / n_
        # Physical bounds: latency cannot fall with load, and batch-1 latency stays positive.
        # When the data barely spread the slope is unknowable: keep the seed's slope (at least
        # 0.1x) and move the line through the data (the intercept takes the shift).
        if k < ks * 0.1:
            k = ks * 0.1
            t0 = (sy - k * sc) / n_
        self.k = k
        self.t0 = max(t0, abs(t0s) * 0.25)


REACT_TOLERANCE = 0.1
"""The latency reaction (one more group when the model says enough) needs the quantile this far
over the target: HPA's default tolerance; below it a window's quantile is noise."""
LEARN_RANGE = (0.5, 1.5)
"""Observed latencies, as multiples of the target, the model learns from."""
SATURATED = LEARN_RANGE[1]
"""Over this multiple of the target the window's throughput lags the demand (a level shift)."""


@dataclass
class LatencyPolicySettings:
    target_s: float
    """Per-token latency target (seconds) at ``percentile``."""
    percentile: float = 0.9
    min_replicas: int = 1
    max_replicas: int = 1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    headroom: float = 1.0
    """Plan the predicted quantile at this share of the target: a window's quantile at the
    target still leaves some minutes over it (the per-minute demand and batch vary around the
    window's)."""
    noise_z: float = 0.9
    """Extra standard deviations of a group's batch planned for (per-minute variation)."""
    scale_down_headroom: float = 1.0
    """Remove groups only to a count whose predicted quantile at the demand (and its peak over
    the scale-down window) stays under this share of the target: hysteresis against the
    scale-up level, so a group is not removed and re-added at the next wiggle."""
    lead_s: float = 600.0
    """How far ahead demand is extrapolated at least; the policy raises it to the load time it
    observes (a scale-up decision until the groups report ready)."""
    trend_window_s: float = 600.0
    """Demand history used for the trend (at least the lead is used)."""
    trend_t: float = 2.0
    """A trend is used only when its slope is this many standard errors above zero and both halves
    of the history rise (a sustained ramp, not noise and not a past step)."""
    forecast: str = "trend"
    level_s: float = 60.0
    trend_s: float = 600.0
    shift_sigma: float = 4.0
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
    _first_decision: float | None = None
    _last_decision: float | None = None
    _interval_s: float = 0.0
    _ready_changed: float | None = None
    _last_ready: int | None = None
    _scale_ups: list = field(default_factory=list)
    _last_c: float | None = None
    _last_demand: float | None = None
    _holt_state: list | None = None
    _load_time_s: float | None = None
    """Last observed time from a scale-up decision to its groups serving."""

    def _latency(self, obs: DecodeObservation) -> float | None:
        q = self.settings.percentile
        if self.settings.metric == "interTokenLatency":
            return obs.step_latency_quantile(q)
        return obs.token_latency_quantile(q)

    def _record(self, now: float, value, history: deque, window: float) -> None:
        history.append((now, value))
        while history and history[0][0] < now - window:
            history.popleft()

    @property
    def lead_s(self) -> float:
        """Seconds ahead demand is predicted: the configured lead or the observed load time, plus
        one decision interval (a group asked for at the next decision serves that much later)."""
        return max(self.settings.lead_s, self._load_time_s or 0.0) + self._interval_s

    def _predicted_demand(self, now: float, demand: float) -> float:
        """``demand`` extrapolated ``lead_s`` ahead along a sustained, significant upward trend."""
        s = self.settings
        self._record(now, demand, self._demand, max(s.trend_window_s, self.lead_s))
        pts = list(self._demand)
        if len(pts) < 3 or pts[-1][0] - pts[0][0] < 30:
            return demand
        slope, t_stat = _slope(pts)
        if slope <= 0 or t_stat < s.trend_t:
            return demand
        half = len(pts) // 2
        if len(pts) >= 6:
            first, _ = _slope(pts[:half + 1])
            second, _ = _slope(pts[half:])
            slope = min(slope, first, second)
            if slope <= 0:
                return demand
        return demand + slope * self.lead_s

    def _holt(self, now: float, demand: float) -> float:
        """Holt's linear trend on demand, with level shifts (a residual over ``shift_sigma``
        standard deviations) taken as a new level, not as a trend: ``demand`` ``lead_s`` ahead."""
        s = self.settings
        h = self._holt_state
        if h is None:
            self._holt_state = [demand, 0.0, now, (0.05 * demand) ** 2]
            return demand
        level, trend, t, var = h
        dt = now - t
        if dt <= 0:
            return max(demand, level + trend * self.lead_s)
        pred = level + trend * dt
        r = demand - pred
        if r * r > s.shift_sigma ** 2 * max(var, (0.02 * demand) ** 2):
            new_level = demand
        else:
            var += 0.1 * (r * r - var)
            a = 1 - math.exp(-dt / s.level_s)
            b = 1 - math.exp(-dt / s.trend_s)
            new_level = a * demand + (1 - a) * pred
            trend = b * (new_level - level) / dt + (1 - b) * trend
        self._holt_state = [new_level, trend, now, var]
        return max(demand, new_level + max(0.0, trend) * self.lead_s)

    def _track_loading(self, now: float, fleet: FleetState) -> None:
        if self._last_ready != fleet.ready:
            self._ready_changed, self._last_ready = now, fleet.ready
        still = []
        for t, target in self._scale_ups:
            if fleet.ready >= target:
                self._load_time_s = now - t
            elif fleet.current >= target and fleet.unplaceable == 0:
                still.append((t, target))
        self._scale_ups = still

    def recommend(self, now: float, obs: DecodeObservation, fleet: FleetState) -> tuple[int, str]:
        """Unstabilized recommendation (scale-up level) and its reason."""
        up, _, why = self._recommend(now, obs, fleet)
        return up, why

    def _recommend(self, now: float, obs: DecodeObservation, fleet: FleetState) -> tuple[int, int, str]:
        """(groups at the scale-up level, groups at the scale-down level, reason)."""
        s = self.settings
        if not obs.has_traffic:
            if s.min_replicas == 0 and self._last_traffic is not None and now - self._last_traffic < s.scale_down_window_s:
                n = max(fleet.current, 1)
                return n, n, "RecentTraffic"
            return s.min_replicas, s.min_replicas, "NoTraffic"
        self._last_traffic = now
        model = self.model
        serving = max(1, fleet.ready)
        per_step = s.metric == "interTokenLatency"
        latency = self._latency(obs)
        al = obs.acceptance_length
        tokens_per_s = obs.generation_tokens / obs.window_s if obs.window_s > 0 else 0.0
        # The model's unit: seconds per token (or per engine step for a per-step target); its
        # demand: tokens/s (or request-steps/s), so that Little's law reads c x n = demand x mean.
        rate = tokens_per_s / al if per_step else tokens_per_s
        mean_step = obs.itl.sum / obs.itl.count if obs.itl.count > 0 and obs.itl.sum > 0 else None
        mean_latency = None if mean_step is None else (mean_step if per_step else mean_step / al)
        if mean_step is not None and tokens_per_s > 0:
            # Little's law over the window: mean requests running = tokens/s x mean seconds per token.
            per_group_c = tokens_per_s * (mean_step / al) / serving
        else:
            per_group_c = obs.running / serving
        self._last_c = per_group_c
        steady = self._ready_changed is None or now - self._ready_changed >= obs.window_s
        # The line is local to the target: a saturated fleet (far over it) or an idle one would bend it.
        near = latency is not None and LEARN_RANGE[0] * s.target_s <= latency <= LEARN_RANGE[1] * s.target_s
        if near and per_group_c > 0 and steady:
            model.update(per_group_c, latency, serving, mean_latency)
        queue_factor = (obs.running + obs.waiting) / obs.running if obs.running > 0 else 1.0
        demand = rate * queue_factor
        if latency is not None and latency > SATURATED * s.target_s and mean_step is not None:
            # Far over target (saturated: a level shift the window lags): the requests running
            # now, each at the window's latency quantile (slower than most of its tokens: a low
            # estimate), are the current demand (Little's law).
            demand = max(demand, (obs.running + obs.waiting) / latency)
        self._last_demand = demand
        plan, plan_down = s.headroom * s.target_s, s.scale_down_headroom * s.target_s
        if model.latency(0.0, 1) >= plan:
            return s.max_replicas, s.max_replicas, "TargetBelowBatch1Latency"
        if demand <= 0 and obs.running + obs.waiting > 0:
            # Requests present but no finished tokens in the window: size by concurrency.
            total = obs.running + obs.waiting
            n = next((n for n in range(1, s.max_replicas + 1) if model.latency(total / n, n) <= plan),
                     s.max_replicas)
            return n, n, "Concurrency"
        predicted = self._holt(now, demand) if s.forecast == "holt" else self._predicted_demand(now, demand)
        most = max(s.max_replicas, fleet.current)
        n = model.groups_for(predicted, plan, most, s.noise_z)
        n_down = model.groups_for(max(predicted, demand), plan_down, most, s.noise_z)
        if n is None:
            n, reason = s.max_replicas, "Saturated"
        else:
            now_n = model.groups_for(demand, plan, most, s.noise_z) or most
            reason = "Predicted" if n > now_n else "Load"
        n_down = max(n, n_down if n_down is not None else most)
        if latency is not None and latency > s.target_s * (1 + REACT_TOLERANCE) and n <= fleet.current \
                and fleet.loading == 0 and fleet.unplaceable == 0:
            n, reason = fleet.current + 1, "OverTarget"  # the model lags reality: react anyway
            n_down = max(n_down, n)
        return n, n_down, reason

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        s = self.settings
        if self._first_decision is None:
            self._first_decision = now
        if self._last_decision is not None and now > self._last_decision:
            self._interval_s = now - self._last_decision
        self._last_decision = now
        self._track_loading(now, fleet)
        if obs is None:
            return Decision(fleet.current, "MetricsUnavailable", "no reading: holding replicas")
        rec, rec_down, why = self._recommend(now, obs, fleet)
        rec = min(max(rec, s.min_replicas), s.max_replicas)
        rec_down = min(max(rec_down, s.min_replicas), s.max_replicas)
        window = max(s.scale_up_window_s, s.scale_down_window_s)
        self._record(now, (rec, rec_down), self._recommendations, window)
        up = max(r for t, (r, _) in self._recommendations if t >= now - s.scale_up_window_s)
        down = max(r for t, (_, r) in self._recommendations if t >= now - s.scale_down_window_s)
        latency = self._latency(obs)
        detail = (f"p{int(s.percentile * 100)} {'ITL' if s.metric == 'interTokenLatency' else 'TPOT'} "
                  f"{latency * 1000:.2f} ms" if latency is not None else "no latency samples")
        detail += f", {obs.running:.0f} running, {obs.waiting:.0f} waiting, recommendation {rec} ({why})"
        if up > fleet.current:
            if fleet.unplaceable > 0:
                return Decision(fleet.current, "Unplaceable",
                                f"{fleet.unplaceable} group(s) cannot be placed: not adding more; {detail}", rec)
            self._scale_ups.append((now, up))
            return Decision(up, "ScaleUp" if why != "Predicted" else "ScaleUpPredicted", detail, rec)
        if fleet.loading > 0 and (down < fleet.current or (latency is not None and latency > s.target_s)):
            # Coming groups are neither added to (F10) nor cancelled: a group half loaded was asked
            # for less than a load time ago, and cancelling it wastes the load already spent.
            return Decision(fleet.current, "GroupsLoading",
                            f"{fleet.loading} group(s) still loading count as coming; {detail}", rec)
        # Scale down only once a whole window of recommendations allowed it (not on a restart),
        # and not while the observed quantile is over the scale-down level (the model may lag).
        if down < fleet.current and latency is not None and latency > s.scale_down_headroom * s.target_s:
            return Decision(fleet.current, "Hold", detail, rec)
        if down < fleet.current and now - self._first_decision >= s.scale_down_window_s:
            return Decision(down, "ScaleDown" if down > 0 else "ScaledToZero", detail, rec)
        return Decision(fleet.current, "Hold", detail, rec)


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of ``(t, value)`` points and its t statistic (inf for an exact line)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    md = sum(d for _, d in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return 0.0, 0.0
    slope = sum((t - mt) * (d - md) for t, d in points) / var
    if n < 3:
        return slope, math.inf if slope else 0.0
    resid = sum((d - md - slope * (t - mt)) ** 2 for t, d in points) / (n - 2)
    se = math.sqrt(resid / var)
    return slope, (slope / se if se > 0 else (math.inf if slope > 0 else 0.0))
