"""Decode-latency policy: how many groups keep the per-token latency under target.

The model (``GroupLatencyModel``; seeded in autoscaler/seed.py from the perf model, learned
online). A step's latency is linear in its batch, ``t0 + k b``. A group does not sit at its mean
batch ``c``: requests come and go at random (the fleet's total is Poisson, mean ``n c``) and the
router shares them among the ``n`` groups, so a group's batch varies around ``c`` with standard
deviation ``sqrt(c / n)``. The token-weighted quantile of the target (P90 per token by default)
sits ``z`` of those above the mean, the token-weighted mean ``w / n`` above it::

    quantile(c, n) = t0 + k (c + z sqrt(c / n))          mean(c, n) = t0 + k (c + w / n)

(seed: ``z`` fitted, 2.0 for the latency recipe; ``w = 1``, Poisson). The same per-group load
is slower with few groups than with many, so capacity per group grows with the group count.
Demand ``D`` (output tokens/s; request-steps/s for a per-step target) becomes concurrency by
Little's law, ``n c = D x mean(c, n)``, i.e. ``c = D (t0 + k w / n) / (n - D k)``: latency is not
linear in load but rises as ``1 / (1 - rho)`` and is infinite past ``n = D k`` (saturation).
Desired groups = the fewest ``n`` whose predicted quantile, with ``noise_z`` more standard
deviations of the batch (a window's quantile at the target still leaves minutes over it), is
``<= headroom x T``.

- Demand: observed output tokens/s scaled up by the queue (``(running + waiting) / running``);
  when the fleet is saturated (quantile > 1.5 T) at least the requests running and waiting now
  at the latency they see now (Little's law: the window lags a jump; this panic path sizes the
  jump in one decision, several groups at once, bounded by max): the window's quantile, or the
  model's mean latency at the batch they make now where that is slower (a window that began
  before the jump holds the faster steps of before, and read alone it over-asks).
- Learned online: each window gives ``c`` by Little's law (tokens/s x mean per-token latency from
  the ITL histogram's sum / count, per serving group; the running gauge without a sum), the
  quantile at ``c + z sqrt(c / n)`` and the mean at ``c + w / n`` (two points at different
  effective batches: each window measures the slope); ``(t0, k)`` follow by exponentially
  weighted least squares regularised toward the seed, only from windows near the target
  (0.5-1.5 T) in which no group joined and the demand did not jump.
- Ahead of the SLO: the demand is forecast ``lead`` ahead (the configured ``lead_s`` or the load
  time observed, whichever is longer, plus one decision interval; the load time is the policy's
  own, from a scale-up decision to its groups serving, or until it has one the cluster's, from
  the serving groups' pods: the groups that served before the policy started loaded
  too, so the first rise is already forecast a whole load ahead): a least-squares
  line through the last ``trend_window_s`` of demand once that history spans half of it, a
  parabola once it spans all of it (a ramp that accelerates, like a day's rise from its trough,
  outgrows its line over a 15-minute load). Scale-up uses each term shrunk by its standard error
  (noise is no trend; successive windows overlap, so the errors are scaled by sqrt(window /
  interval)) and only an upward acceleration; scale-down keeps the unshrunk trend (removing a
  group on an upswing costs a load time to get it back). A level shift (the demand is 4x its
  usual relative deviation away from what the readings up to one window back expect now: their
  parabola carried forward once they span half the trend window, else the last of them; a step,
  a burst, not a ramp's noisy reading) restarts the history: a step is not a trend. The forecast
  is raised by its own measured shortfall (forecasts made a lead time ago against the demand that
  came, exponentially averaged; shifts excluded).
- Stabilization: scale-up takes the highest recommendation of ``scale_up_window_s``, scale-down
  the highest of ``scale_down_window_s`` (Kubernetes HPA semantics) at the ``scale_down_headroom``
  level, only once the policy has a whole window of history (nothing scales down on an operator
  restart), never while the observed quantile is over that level, and never to a count whose
  quantile, predicted as the one observed now plus the model's step to that count, passes it
  (the model can be off where it stands, its slope less so); bounded by min/max. One group more
  while the target holds (within the reaction's 10% tolerance) waits until the recommendations
  of a whole window agree (a group costs a load time of GPU-hours); a surge does not wait.
- Bursts shorter than a load time: groups that arrive to a demand 1.5x lower than the one that
  asked for them mark the load as bursty; scale-down then keeps what the burst asked for during
  ``burst_hold_loads`` load times, extended by each new upward shift, so that the groups one
  burst brought serve the next one. That first ask was sized on a saturated fleet; each later
  burst the held groups serve is measured (the highest recommendation while it lasts), and the
  hold keeps the most the bursts measured within it needed.
- Groups still loading are counted as coming: they are not cancelled, and while one loads no
  scale-up follows from latency (failure case F10); a higher DEMAND (which does not compound
  with the groups' count) may still add groups. The latency reaction (one more group when the
  quantile is over 1.1 T and the model says enough) only runs with nothing loading, and once the
  window has seen only the groups serving now (new groups first clear what queued before them).
  Groups that cannot be placed are not counted as capacity, and adding more cannot help: the
  policy holds and says so.
- No reading -> hold (never scale down). "No traffic" is a reading: with ``min_replicas = 0`` the
  fleet goes to zero once the whole scale-down window saw none (F11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from kimik3.api.v1alpha1 import LatencyMetric
from kimik3.autoscaler.observation import DecodeObservation
from kimik3.autoscaler.window import Samples


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
    serving: frozenset[str] = frozenset()
    """Indexes of the groups serving (every pod Ready), when the caller knows them: a serving
    group absent from the observation's ``groups`` is unmeasured, and a decision with an
    unmeasured group may scale up but never down (its load is unknown, not low)."""
    load_time_s: float | None = None
    """Seconds from a serving group's pods' creation to every one of them Ready, the shortest over
    the serving groups (None: unknown). The groups that served before the policy started loaded
    too: until the policy has timed a scale-up of its own, this is how far ahead it must look."""


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    """CamelCase reason, also used in Events and status.lastScale."""
    message: str = ""
    recommendation: int | None = None
    """The unstabilized recommendation, for observability."""


class Policy(Protocol):
    """Anything that turns (time, observation or None, fleet) into a Decision, at its own cadence.

    Whoever drives a policy (the controller, the kit's fleet simulator) calls ``decide`` every
    ``interval_s`` seconds with an observation over the last ``window_s`` seconds, or None when
    no reading could be made. A policy that reads no metrics (a fixed schedule) declares
    ``window_s`` None and is always given None."""

    @property
    def interval_s(self) -> float:
        """Seconds between decisions."""
        ...

    @property
    def window_s(self) -> float | None:
        """Seconds of metrics each decision reads (the observation window); None: reads none."""
        ...

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
SHIFT = 4.0
"""A demand this many times its usual relative change away from what the readings of one window
back expect is a level shift (a step, a burst starting or ending): the trend's history restarts."""
PARABOLA_MIN_POINTS = 6
"""Readings a parabola is fitted to at least (three coefficients and three readings for their
standard errors); fewer get a line, or the last reading."""
SHIFT_FLOOR = 0.03
"""The usual relative change used for level shifts is at least this."""
BURST_DROP = 1.5
"""Groups that arrive to a demand this many times lower than the one they were asked for were
asked for by a burst shorter than the load time."""


@dataclass
class LatencyPolicySettings:
    target_s: float
    """Per-token latency target (seconds) at ``percentile``."""
    percentile: float = 0.9
    interval_s: float = 30.0
    """Seconds between decisions (``autoscaling.interval``; the API's default)."""
    window_s: float = 120.0
    """Seconds of metrics each decision reads (``autoscaling.window``; the API's default)."""
    min_replicas: int = 1
    max_replicas: int = 1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    headroom: float = 1.0
    """Plan the predicted quantile (with the ``noise_z`` margin) at this share of the target."""
    noise_z: float = 0.7
    """Standard deviations of a group's batch planned for beyond the model's quantile: a window's
    quantile at the target still leaves minutes over it (each minute's demand and batch vary
    around the window's). Measured in the fleet simulator for the latency recipe: with 3 to 13
    groups at a constant rate, minutes over target start 0.65-1.4 such standard deviations above
    the model's quantile (fewer groups: more). On the trace benchmark 0.7 held the steady trace at
    100% of minutes (0: 95.0%) and the diurnal one at 99.2% (0: 91.7%)."""
    scale_down_headroom: float = 1.0
    """Remove groups only to a count whose predicted quantile stays under this share of the target
    (1.0: the scale-up level; lower adds hysteresis. 0.85 cost 5% more GPU-hours on the steady
    trace and 8% on the diurnal one, for 0.8 points of SLO on the diurnal one)."""
    lead_s: float = 600.0
    """How far ahead demand is extrapolated at least; the policy raises it to the load time it
    observes (a scale-up decision until the groups report ready; before its first, the cluster's
    ``FleetState.load_time_s``), plus one decision interval."""
    trend_window_s: float = 1800.0
    """Demand history the forecast is fitted on: a line once it spans half of it, a parabola (an
    accelerating ramp) once it spans all of it."""
    trend_shrink: float = 1.0
    """Each term of the forecast (slope, acceleration) is shrunk toward zero by this many
    standard errors before the scale-up side uses it: noise is no trend."""
    correct_gain: float = 0.1
    """Per decision, how fast the forecast's measured shortfall (forecasts made a lead time ago
    against the demand that came) follows; the forecast is raised by it."""
    burst_hold_loads: float = 2.0
    """After bursts shorter than a load time (groups asked for arrive to find their demand gone),
    scale-down keeps what the bursts need during this many load times (what the first asked for,
    until the held groups have served one and measured it), so that the groups one burst brought
    serve the next one; each new burst extends it. 0 disables."""
    metric: LatencyMetric = "timePerOutputToken"
    """timePerOutputToken (per token) or interTokenLatency (raw vLLM ITL per engine step)."""


@dataclass
class LatencyPolicy:
    """kimik3's policy (module docstring). One instance per deployment: it keeps the history."""

    settings: LatencyPolicySettings
    model: GroupLatencyModel
    _recommendations: Samples[tuple[int, int]] = field(default_factory=Samples)
    """(scale-up level, scale-down level) of each decision."""
    _demand: Samples[float] = field(default_factory=Samples)
    """Demand since the last level shift, for the trend."""
    _forecasts: Samples[float] = field(default_factory=Samples)
    """Forecasts made, to measure the forecast's shortfall a lead time later."""
    _shortfall: float = 0.0
    _noise: float = 0.05 ** 2
    """Relative variance of the demand's change over one window (level shifts left out)."""
    _shift_at: float | None = None
    """Last level shift of the demand, and whether it went up."""
    _shift_up: bool = False
    _keep_demand: float = 0.0
    """The demand forecast with the trend unshrunk: what scale-down must keep serving."""
    _last_traffic: float | None = None
    _first_decision: float | None = None
    _window_s: float = 0.0
    """Window of the last observation (seconds)."""
    _ready_changed: float | None = None
    _ready_rose: float | None = None
    """Last time more groups served than at the decision before."""
    _last_ready: int | None = None
    _scale_ups: list = field(default_factory=list)
    """(time, target, groups before, demand then) of scale-ups whose groups are still coming."""
    _bursty_until: float | None = None
    """Until then scale-down keeps ``burst_level`` groups (what the bursts need)."""
    _burst_level: int = 0
    """What the groups that marked the load bursty were asked for (the first guess of a burst's need)."""
    _burst_peaks: Samples[int] = field(default_factory=Samples)
    """The need (highest recommendation) of each burst the held groups served."""
    _burst_open: tuple[float, float, int] | None = None
    """The burst being served: (the demand just before it, the highest demand since, the highest
    recommendation since, taken with nothing loading); None: none is."""
    _calm_demand: float | None = None
    """The previous decision's demand."""
    _last_c: float | None = None
    _last_demand: float | None = None
    _load_time_s: float | None = None
    """Last observed time from a scale-up decision to its groups serving."""
    _cluster_load_s: float | None = None
    """The last load time the cluster reported (``FleetState.load_time_s``)."""

    def _latency(self, obs: DecodeObservation) -> float | None:
        return obs.latency_quantile(self.settings.metric, self.settings.percentile)

    @property
    def interval_s(self) -> float:
        return self.settings.interval_s

    @property
    def window_s(self) -> float:
        return self.settings.window_s

    @property
    def lead_s(self) -> float:
        """Seconds ahead demand is predicted: the configured lead or the observed load time (of
        this policy's own last scale-up, else the one the cluster reports for its newest serving
        groups), whichever is longer, plus one decision interval (a group asked for at the next
        decision serves that much later)."""
        load = self._load_time_s if self._load_time_s is not None else self._cluster_load_s
        return max(self.settings.lead_s, load or 0.0) + self.interval_s

    @property
    def burst_hold_s(self) -> float:
        return self.settings.burst_hold_loads * self.lead_s

    # ------------------------------------------------------------------ the demand forecast ---
    def _predicted_demand(self, now: float, demand: float, window_s: float = 0.0) -> float:
        """``demand`` ``lead_s`` ahead (module docstring, "Ahead of the SLO"). Also sets
        ``_keep_demand``, the same forecast with the trend unshrunk (for scale-down)."""
        s = self.settings
        self._window_s = window_s
        hist = self._demand
        # A level shift: the demand is more than SHIFT times its usual relative deviation away
        # from what the windows that do not overlap this one expect now (their trend: compared
        # with the last reading alone, a noisy reading on a ramp passed for a step).
        past = [(t, d) for t, d in hist if t <= now - window_s + 1e-6]
        expected = self._expected(past, now)
        if self._shift_at is not None and now - self._shift_at < window_s:
            hist.clear()  # the window still straddles the shift: its demand moves on its own
        elif expected is not None and expected > 0:
            r = (demand - expected) / expected
            sd = max(math.sqrt(self._noise), SHIFT_FLOOR)
            if abs(r) > SHIFT * sd:
                hist.clear()
                self._shift_at, self._shift_up = now, r > 0
            else:
                # Winsorized: a change building up over several windows must not teach the noise.
                self._noise += 0.1 * (min(r * r, (2 * sd) ** 2) - self._noise)
        hist.add(now, demand)
        hist.forget_before(now - s.trend_window_s)
        self._keep_demand = demand
        pts = list(hist)
        if len(pts) < 4 or pts[-1][0] - pts[0][0] < s.trend_window_s / 2:
            return self._corrected(now, demand, demand)
        # Successive windows overlap (a 2-minute window every 30 s): their errors are correlated,
        # so the fit's standard errors are scaled up by sqrt(window / interval).
        overlap = math.sqrt(window_s / self.interval_s) if 0 < self.interval_s < window_s else 1.0
        lead = self.lead_s
        if len(pts) >= PARABOLA_MIN_POINTS and pts[-1][0] - pts[0][0] >= s.trend_window_s - self.interval_s - 1e-6:
            level, slope, accel, se_b, se_c = _quadratic_now(pts, now)
        else:
            level, slope, _ = _line_now(pts, now)
            accel, se_b, se_c = 0.0, _slope_se(pts), 0.0
        se_b, se_c = se_b * overlap, se_c * overlap
        # Removing a group on an upswing costs a load time to get it back: scale-down keeps the
        # trend as it is. Adding one on noise costs a load time of GPU-hours: scale-up takes each
        # term shrunk by its standard errors. Only an accelerating ramp is bent upward.
        self._keep_demand = max(demand, level + max(0.0, slope) * lead + max(0.0, accel) * lead * lead)
        slope = max(0.0, slope - s.trend_shrink * se_b)
        accel = max(0.0, accel - s.trend_shrink * se_c)
        return self._corrected(now, demand, max(demand, level + slope * lead + accel * lead * lead))

    def _expected(self, past: list[tuple[float, float]], now: float) -> float | None:
        """The demand ``past`` (readings of windows that do not overlap the one ending ``now``)
        expects now: its least-squares parabola carried to ``now`` once it spans half the trend
        window (a ramp moves the demand too: a trend is no level shift), else its last reading;
        None without any."""
        if not past:
            return None
        if len(past) >= PARABOLA_MIN_POINTS and past[-1][0] - past[0][0] >= self.settings.trend_window_s / 2:
            return _quadratic_now(past, now)[0]
        return past[-1][1]

    def _corrected(self, now: float, demand: float, forecast: float) -> float:
        """``forecast`` raised by the shortfall of the forecasts made a lead time ago against the
        demand that came (an exponential average; a level shift in between is no shortfall)."""
        s = self.settings
        made = self._forecasts
        made.add(now, forecast)
        made.forget_before(now - self.lead_s - 2 * self.interval_s)
        due = made.until(now - self.lead_s + 1e-6)
        if self._shift_at is not None and now - self._shift_at < self.lead_s + self._window_s:
            due, self._shortfall = [], 0.0
        if due and due[-1] > 0:
            self._shortfall += s.correct_gain * ((demand - due[-1]) / due[-1] - self._shortfall)
        return forecast * (1 + max(0.0, self._shortfall))

    # ------------------------------------------------------------------ sizing ---------------
    def _groups_for(self, demand: float, latency_s: float, most: int) -> int | None:
        """Fewest groups whose predicted quantile, with the ``noise_z`` margin, is <= ``latency_s``."""
        return self.model.groups_for(demand, latency_s, most, self.settings.noise_z)

    def _track_loading(self, now: float, fleet: FleetState) -> list[tuple[float, int, int, float]]:
        """Follow this policy's scale-ups: those whose groups now serve are returned (and give
        the load time); those undone by someone else are forgotten."""
        if self._last_ready != fleet.ready:
            if self._last_ready is not None and fleet.ready > self._last_ready:
                self._ready_rose = now
            self._ready_changed, self._last_ready = now, fleet.ready
        still, done = [], []
        for entry in self._scale_ups:
            if fleet.ready >= entry[1]:
                self._load_time_s = now - entry[0]
                done.append(entry)
            elif fleet.current >= entry[1] and fleet.unplaceable == 0:
                still.append(entry)
        self._scale_ups = still
        return done

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
        queue_factor = (obs.running + obs.waiting) / obs.running if obs.running > 0 else 1.0
        demand = rate * queue_factor
        if latency is not None and latency > SATURATED * s.target_s:
            # Far over target (saturated: a level shift the window lags): the requests running
            # now, each at the window's latency quantile or at the model's mean latency for the
            # batch they make now, whichever is slower (a window that began before the jump holds
            # faster steps than the ones taken now), are the current demand (Little's law). Panic
            # path: this sizes the jump at once, several groups in one decision.
            now_latency = max(latency, model.mean_latency(obs.running / serving, serving))
            demand = max(demand, (obs.running + obs.waiting) / now_latency)
        self._last_demand = demand
        # The forecast first: it tells whether the demand jumped inside the window.
        predicted = self._predicted_demand(now, demand, obs.window_s) if demand > 0 else demand
        # Learn only from windows of one fleet and one level of load (no group joined, no level
        # shift of the demand inside the window), near the target (a saturated or an idle fleet
        # would bend the line).
        steady = (self._ready_changed is None or now - self._ready_changed >= obs.window_s) and \
            (self._shift_at is None or now - self._shift_at >= obs.window_s)
        # Groups joined inside the window: they first clear what queued before them.
        joined = self._ready_rose is not None and now - self._ready_rose < obs.window_s
        near = latency is not None and LEARN_RANGE[0] * s.target_s <= latency <= LEARN_RANGE[1] * s.target_s
        if latency is not None and near and per_group_c > 0 and steady:
            model.update(per_group_c, latency, serving, mean_latency)
        plan, plan_down = s.headroom * s.target_s, s.scale_down_headroom * s.target_s
        if model.latency(0.0, 1) >= plan:
            return s.max_replicas, s.max_replicas, "TargetBelowBatch1Latency"
        if demand <= 0 and obs.running + obs.waiting > 0:
            # Requests present but no finished tokens in the window: size by concurrency.
            total = obs.running + obs.waiting
            n = next((n for n in range(1, s.max_replicas + 1) if model.latency(total / n, n) <= plan),
                     s.max_replicas)
            return n, n, "Concurrency"
        most = max(s.max_replicas, fleet.current)
        up = self._groups_for(predicted, plan, most)
        keep = max(predicted, self._keep_demand, demand)
        down = self._groups_for(keep, plan_down, most)
        if up is None:
            n, reason = s.max_replicas, "Saturated"
        else:
            n, reason = up, "Predicted" if up > (self._groups_for(demand, plan, most) or most) else "Load"
        n_down = max(n, down if down is not None else most)
        if latency is not None and n_down < serving and steady and near:
            # Fewer groups than serve now: the model's step from this count, added to the quantile
            # observed at it (the model can be off where it stands, its slope less so).
            base = model.predict(demand, serving)
            while n_down < serving and latency + model.predict(keep, n_down, s.noise_z) - base > plan_down:
                n_down += 1
        if latency is not None and latency > s.target_s * (1 + REACT_TOLERANCE) and n <= fleet.current \
                and fleet.loading == 0 and fleet.unplaceable == 0 and not joined:
            # The model lags reality: react anyway, once the window has seen only the groups that
            # serve now (groups that just joined have not yet cleared what queued before them).
            n, reason = fleet.current + 1, "OverTarget"
            n_down = max(n_down, n)
        return n, n_down, reason

    # ------------------------------------------------------------------ bursts ---------------
    def _follow_bursts(self, now: float, arrived: list[tuple[float, int, int, float]], rec: int,
                       fleet: FleetState, shifted: float | None) -> None:
        """Bursts shorter than a load time (module docstring). Groups that arrive to find the
        demand they were asked for gone mark the load bursty: scale-down keeps what the burst
        asked for. That ask was made on a saturated fleet (the panic path's estimate, and a
        window that lagged the burst), so it is only the first guess: each later burst the held
        groups serve is measured, and the level becomes the highest recommendation (what the
        policy would ask for to serve it) of the bursts measured within the hold. A burst ends at
        the demand's downward shift, or at the next upward one, and counts if its demand rose
        ``BURST_DROP`` times over the one before it (a smaller rise is no burst) and a
        recommendation was taken with no group loading."""
        late = [target for _, target, _, then in arrived
                if self._last_demand is not None and self._last_demand * BURST_DROP < then]
        calm, self._calm_demand = self._calm_demand, self._last_demand
        new_shift = self._shift_at == now and shifted != now
        if late:
            # Only groups kept from one burst can serve the next: keep what the burst asked for.
            self._burst_level = max(late)
            self._bursty_until = now + self.burst_hold_s
            self._burst_peaks.clear()
            self._burst_open = None
            return
        if self._bursty_until is None or now >= self._bursty_until:
            self._burst_open = None
            return
        if self._burst_open is not None and new_shift:
            before, top, need = self._burst_open
            if need > 0 and top >= BURST_DROP * before:  # the burst served is over: its need
                self._burst_peaks.add(now, need)
            self._burst_open = None
        if new_shift and self._shift_up:
            self._bursty_until = now + self.burst_hold_s  # another burst: keep holding, and measure it
            self._burst_open = (calm or 0.0, 0.0, 0)
        if self._burst_open is not None and fleet.loading == 0:
            before, top, need = self._burst_open
            self._burst_open = (before, max(top, self._last_demand or 0.0), max(need, rec))
        self._burst_peaks.forget_before(now - self.burst_hold_s)

    def burst_level(self, now: float) -> int:
        """Groups scale-down keeps while the load is bursty: the highest need of the bursts the
        held groups served within the hold (else, before any was measured, what the first burst
        asked for), and of the one being served."""
        measured = self._burst_peaks.since(now - self.burst_hold_s) or [self._burst_level]
        return max(measured + ([self._burst_open[2]] if self._burst_open is not None else []))

    # ------------------------------------------------------------------ the decision ---------
    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        decision = self._decide(now, obs, fleet)
        unmeasured = sorted(fleet.serving - obs.groups, key=lambda g: (len(g), g)) if obs is not None else []
        if unmeasured and decision.desired < fleet.current:
            return Decision(fleet.current, "MetricsIncomplete",
                            f"group(s) {', '.join(unmeasured)} of {len(fleet.serving)} serving gave no metrics: "
                            f"not scaling down on a partial reading ({decision.reason}: {decision.message})",
                            decision.recommendation)
        return decision

    def _decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        s = self.settings
        if self._first_decision is None:
            self._first_decision = now
        if fleet.load_time_s is not None:
            self._cluster_load_s = fleet.load_time_s
        arrived = self._track_loading(now, fleet)
        if obs is None:
            return Decision(fleet.current, "MetricsUnavailable", "no reading: holding replicas")
        shifted = self._shift_at
        rec, rec_down, why = self._recommend(now, obs, fleet)
        rec = min(max(rec, s.min_replicas), s.max_replicas)
        rec_down = min(max(rec_down, s.min_replicas), s.max_replicas)
        window = max(s.scale_up_window_s, s.scale_down_window_s, obs.window_s)
        self._recommendations.add(now, (rec, rec_down))
        self._recommendations.forget_before(now - window)
        if s.burst_hold_loads > 0:
            self._follow_bursts(now, arrived, rec, fleet, shifted)
        if not obs.has_traffic:
            self._bursty_until = None  # no traffic is no burst to come: F11 may scale to zero
        bursty = self._bursty_until is not None and now < self._bursty_until
        up = max(r for r, _ in self._recommendations.since(now - s.scale_up_window_s))
        down = max(r for _, r in self._recommendations.since(now - s.scale_down_window_s))
        if bursty:
            down = max(down, min(self.burst_level(now), s.max_replicas))
        latency = self._latency(obs)
        if up == fleet.current + 1 and (latency is None or latency <= s.target_s * (1 + REACT_TOLERANCE)):
            # One group more while the target holds (within the reaction's tolerance: a forecast,
            # or noise) costs a load time of GPU-hours: it waits until the readings of a whole
            # window agree. A surge (several groups) or a broken target does not wait.
            agreeing = now
            for t, (r, _) in reversed(self._recommendations):
                if r <= fleet.current:
                    break
                agreeing = t
            if now - agreeing < obs.window_s - self.interval_s - 1e-6:
                up = fleet.current
        above = ">= " if obs.above_top_bucket(s.percentile) else ""  # F21a: a lower bound only
        detail = (f"p{int(s.percentile * 100)} {'ITL' if s.metric == 'interTokenLatency' else 'TPOT'} "
                  f"{above}{latency * 1000:.2f} ms" + (" (above the histogram's top bucket)" if above else "")
                  if latency is not None else "no latency samples")
        detail += f", {obs.running:.0f} running, {obs.waiting:.0f} waiting, recommendation {rec} ({why})"
        if up > fleet.current:
            if fleet.unplaceable > 0:
                return Decision(fleet.current, "Unplaceable",
                                f"{fleet.unplaceable} group(s) cannot be placed: not adding more; {detail}", rec)
            self._scale_ups.append((now, up, fleet.current, self._last_demand or 0.0))
            return Decision(up, "ScaleUp" if why != "Predicted" else "ScaleUpPredicted", detail, rec)
        if fleet.loading > 0 and (down < fleet.current or (latency is not None and latency > s.target_s)):
            # Coming groups are neither added to (F10) nor cancelled: a group half loaded was asked
            # for less than a load time ago (cancelling them, as HPA's window does, measured 78%
            # SLO instead of 96% on the bursts trace).
            return Decision(fleet.current, "GroupsLoading",
                            f"{fleet.loading} group(s) still loading count as coming; {detail}", rec)
        # Scale down only once a whole window of recommendations allowed it (not on a restart),
        # and not while the observed quantile is over the scale-down level (the model may lag).
        if down < fleet.current and latency is not None and latency > s.scale_down_headroom * s.target_s:
            return Decision(fleet.current, "Hold", detail, rec)
        if down < fleet.current and now - self._first_decision >= s.scale_down_window_s:
            return Decision(down, "ScaleDown" if down > 0 else "ScaledToZero", detail, rec)
        return Decision(fleet.current, "Hold", detail + (", keeping the last bursts' groups" if bursty else ""), rec)


def _line_now(points: list[tuple[float, float]], now: float) -> tuple[float, float, float]:
    """Least-squares line through ``(t, value)`` points: (its value at ``now``, slope, residual
    standard deviation)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    md = sum(d for _, d in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    slope = sum((t - mt) * (d - md) for t, d in points) / var if var > 0 else 0.0
    resid = sum((d - md - slope * (t - mt)) ** 2 for t, d in points)
    scatter = math.sqrt(resid / (n - 2)) if n > 2 else 0.0
    return md + slope * (now - mt), slope, scatter


def _slope_se(points: list[tuple[float, float]]) -> float:
    """Standard error of the least-squares slope of ``(t, value)`` points."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if n < 3 or var <= 0:
        return 0.0
    return _line_now(points, mt)[2] / math.sqrt(var)


def _quadratic_now(points: list[tuple[float, float]], now: float) -> tuple[float, float, float, float, float]:
    """Least-squares ``value = a + b (t - now) + c (t - now)^2`` through ``(t, value)`` points:
    (a, b, c, standard error of b, standard error of c)."""
    xs = [t - now for t, _ in points]
    ys = [v for _, v in points]
    n = len(xs)
    # Normal equations on the 3x3 moment matrix, solved by Cramer's rule.
    m = [[sum(x ** (i + j) for x in xs) for j in range(3)] for i in range(3)]
    r = [sum(y * x ** i for x, y in zip(xs, ys)) for i in range(3)]
    d = _det3(m)
    if n < 4 or abs(d) < 1e-12:
        level, slope, _ = _line_now(points, now)
        return level, slope, 0.0, _slope_se(points), 0.0
    coef = []
    for k in range(3):
        mk = [row[:] for row in m]
        for i in range(3):
            mk[i][k] = r[i]
        coef.append(_det3(mk) / d)
    a, b, c = coef
    resid = sum((y - a - b * x - c * x * x) ** 2 for x, y in zip(xs, ys)) / (n - 3)
    # Variances: the residual variance times the inverse moment matrix's diagonal (cofactor / det).
    inv_bb = (m[0][0] * m[2][2] - m[0][2] * m[2][0]) / d
    inv_cc = (m[0][0] * m[1][1] - m[0][1] * m[1][0]) / d
    return a, b, c, math.sqrt(max(0.0, resid * inv_bb)), math.sqrt(max(0.0, resid * inv_cc))


def _det3(a: list[list[float]]) -> float:
    return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))
