"""The peers' autoscaling rules, each at its best documented configuration for a P90 per-token
latency target (issue 16), as a ``Policy`` (``decide(now, obs, fleet) -> Decision``) for the
trace benchmark. Rules and defaults are the peers' own (sources below; read for facts, no code
copied). A number a peer leaves to its user (a target value, a band, a predictor) is chosen
ONCE, from a small grid, on one seed of one trace (``benchmark/peers.py``: ``GRID``, ``CHOSEN``)
and used unchanged on every seed and trace reported; docs/benchmarks.md gives the grid's figures.

==================== ===========================================================================
policy               rule and source
==================== ===========================================================================
``HPAPolicy``        Kubernetes HorizontalPodAutoscaler (autoscaling/v2; pkg/controller/podautoscaler
                     replica_calculator.go, horizontal.go; kubernetes.io "Horizontal Pod
                     Autoscaling"): an External metric with a ``Value`` target, the P90 per-token
                     latency over 2 min as a Prometheus adapter serves it
                     (``histogram_quantile(0.9, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket[2m])))``
                     / tokens per step); ``desired = ceil(ready x observed / target)`` unless
                     ``|observed/target - 1| <= 0.1`` (--horizontal-pod-autoscaler-tolerance);
                     sync every 15 s; default ``behavior``: scale-up stabilization 0 s, up to
                     max(+100 %, +4 pods) per 15 s; scale-down stabilization 300 s (the highest
                     recommendation of the window), up to -100 % per 15 s. User's number: the
                     metric's target value (grid: 1.0, 0.9, 0.8, 0.7 x the SLO).
``KEDASLOPolicy``    llm-d's SLO-aware autoscaling with KEDA (llm-d/llm-d
                     docs/architecture/autoscaling/slo-aware-keda.md, "the control law", and
                     guides/workload-autoscaling/slo-aware/README.md, "Tunables"): saturation
                     ``s_raw = P90 TPOT / SLO`` (``histogram_quantile(0.9, ...)`` over 1-minute
                     bucket rates, recorded every 15 s; no traffic -> 0), clamped at C = 2.0 and
                     averaged over 45 s; ``d = n + ceil(n (s c / theta_up - 1))`` above ``theta_up``
                     with the warming credit ``c = r / n`` (ready / provisioned, when 0 < r < n),
                     ``d = n - floor(n (1 - s / theta_dn))`` below ``theta_dn`` (uncredited), else
                     ``n``; ``d`` is the ScaledObject's formula output (AverageValue target 1) fed
                     to the HPA (10 % tolerance) with the guide's ``behavior``: up max(100 %, 4 pods)
                     per 60 s after a 30 s stabilization (lowest of the window), down 1 pod per
                     120 s after 180 s (highest of the window). User's number: the band
                     ``(theta_dn, theta_up)``, 0.40 / 0.55 benchmarked by llm-d, "raise both"
                     when the SLO is close to the base latency (ours: batch-1 latency is 0.42 of
                     the SLO; grid: 0.40/0.55, 0.55/0.70, 0.70/0.85, 0.80/0.95).
``KPAPolicy``        AIBrix KPA (Knative KPA semantics; AIBrix docs "Autoscaling", knative.dev
                     serving/autoscaling/kpa-specific "stable and panic"): concurrency (requests in
                     flight at the groups, running + waiting, as Knative's queue-proxies report
                     it: the fleet's gateway, not vLLM's series) averaged over a 60 s stable and a 6 s panic window (10 %),
                     ``desired = ceil(avg / target)``; panic when the panic desire reaches 2x the
                     ready groups, never scale down in panic, leave it after a stable window
                     without; rate limits up x2 / down /2 per decision (AIBrix), tolerance 10 %,
                     scale-down delay 300 s; tick 2 s (Knative's tick-interval). User's number: the
                     target concurrency per group, read off the profile: the batch whose
                     per-token latency is a share of the SLO (grid: 1.0, 0.9, 0.8, 0.7).
``DynamoPlannerPolicy`` NVIDIA Dynamo SLA planner, throughput-based decode scaling (docs.nvidia.com
                     "Planner Design"; ai-dynamo/dynamo planner config/defaults.py:
                     throughput_adjustment_interval 180 s, predictors constant / arima / kalman /
                     prophet, Kalman q_level 1.0, q_trend 0.1, r 10, min_points 5): every 180 s,
                     predict the next interval's request count and mean output length from the
                     frontend's counters; ``decode_correction = observed mean ITL / profiled ITL at
                     the observed load``; ``corrected_itl = target / decode_correction``; ``decode
                     replicas = ceil(predicted output tok/s / best per-GPU tok/s with ITL <=
                     corrected_itl / GPUs per engine)``. Profile: the perf model (Dynamo profiles
                     the engine for hours; ours is the calibrated model). Dynamo's ITL target is a
                     mean: the user sets the mean ITL target whose P90 meets the SLO. User's
                     numbers: that ITL target (grid: 1.0, 0.9, 0.8, 0.7 x the SLO) and the
                     predictor (grid: constant, kalman; arima, Dynamo's default, needs pmdarima's
                     auto_arima, which the project does not ship).
``StaticPolicy``     Static provisioning: a fixed group count (the benchmark uses the hindsight peak).
                     Reads no metrics (``window_s`` None), like ``OptimalPolicy``.
``OptimalPolicy``    Hindsight optimum: knowing the whole trace and the load time, the fewest ready
                     groups each minute that keep the SLO (found by simulation,
                     ``benchmark/simulate.py``), each group started exactly one load time before it is
                     needed and kept through gaps shorter than a load time (keeping is then cheaper
                     than reloading).
==================== ===========================================================================

Each declares its cadence as the ``Policy`` protocol asks: ``interval_s`` between decisions and
``window_s``, the metrics each decision reads (the fleet simulator reads them through the
operator's pod-scrape source); the windows inside a rule (stabilization, stable and panic
windows, rate-limit periods, smoothing) are ``kimik3.autoscaler.window.Samples``, like our policy's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kimik3.api.conditions import EventReason
from kimik3.autoscaler.histogram import mean
from kimik3.autoscaler.observation import DecodeObservation
from kimik3.autoscaler.perfmodel import DEFAULT_WORKLOAD, EngineShape, decode_point, perf_params
from kimik3.autoscaler.policy import Decision, FleetState
from kimik3.autoscaler.window import Samples
from kimik3_dev.benchmark.fleet import GatewayReading


# ---------------------------------------------------------------- profile -------------------
@dataclass(frozen=True)
class Profile:
    """A group's decode profile from the perf model: per batch ``b`` (requests per group),
    per-token latency ``tpot_s[b]`` (seconds) and group throughput ``tokens_per_s[b]`` (output
    tokens/s). Index 0 is unused (0 latency, 0 throughput)."""

    tpot_s: tuple[float, ...]
    tokens_per_s: tuple[float, ...]
    gpus: int
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens/s the group prefills (the perf model's rate, its units together)."""

    @classmethod
    def from_shape(cls, shape: EngineShape, max_batch: int = 64, workload: str | float = DEFAULT_WORKLOAD) -> Profile:
        params = perf_params(shape)
        engines = params.engines_per_unit * params.units
        tpot, tput = [0.0], [0.0]
        for b in range(1, max_batch + 1):
            d = decode_point(params, max(1, b // engines) if engines > 1 else b, workload)
            tpot.append(d.tpot_s)
            tput.append(d.group_tokens_per_s)
        return cls(tuple(tpot), tuple(tput), shape.gpus, params.prefill_tokens_per_s * params.units)

    def concurrency_at(self, latency_s: float) -> float:
        """Requests per group at which the per-token latency reaches ``latency_s`` (linear between
        batches; 0 below batch-1 latency, the largest batch above the last)."""
        t = self.tpot_s
        if latency_s < t[1]:
            return 0.0
        for b in range(2, len(t)):
            if t[b] >= latency_s:
                return b - 1 + (latency_s - t[b - 1]) / (t[b] - t[b - 1])
        return float(len(t) - 1)

    def _at(self, series: tuple[float, ...], c: float) -> float:
        if c <= 1:
            return series[1] * max(c, 0.0) if series is self.tokens_per_s else series[1]
        lo = min(int(c), len(series) - 2)
        return series[lo] + (series[lo + 1] - series[lo]) * (c - lo)

    def tokens_per_gpu_at(self, latency_s: float) -> float:
        """Best output tokens/s per GPU with per-token latency <= ``latency_s``."""
        c = self.concurrency_at(latency_s)
        return self._at(self.tokens_per_s, c) / self.gpus if c > 0 else 0.0

    def latency_at_tokens_per_gpu(self, tokens_per_gpu: float) -> float:
        """Per-token latency the profile expects at ``tokens_per_gpu`` output tokens/s per GPU."""
        per_group = tokens_per_gpu * self.gpus
        tp = self.tokens_per_s
        if per_group <= tp[1]:
            return self.tpot_s[1]
        for b in range(2, len(tp)):
            if tp[b] >= per_group:
                x = (per_group - tp[b - 1]) / (tp[b] - tp[b - 1])
                return self.tpot_s[b - 1] + (self.tpot_s[b] - self.tpot_s[b - 1]) * x
        return self.tpot_s[-1]


def _hold(fleet: FleetState, why: str) -> Decision:
    return Decision(fleet.current, EventReason.METRICS_UNAVAILABLE, why)


# ---------------------------------------------------------------- HPA -----------------------
@dataclass
class HPABehavior:
    """Kubernetes HPA's default ``behavior`` (autoscaling/v2 API reference)."""

    scale_up_window_s: float = 0.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    scale_down_window_s: float = 300.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    scale_down_pods: int | None = None
    """A ``Pods`` scale-down policy instead of the percent one (llm-d's guide: 1 pod per 120 s)."""


@dataclass
class _HPACore:
    """The HPA controller's normalization: stabilization windows, then rate limits, then min/max
    (horizontal.go ``normalizeDesiredReplicasWithBehaviors``)."""

    min_replicas: int
    max_replicas: int
    behavior: HPABehavior = field(default_factory=HPABehavior)
    _recs: Samples[int] = field(default_factory=Samples)
    _events: Samples[int] = field(default_factory=Samples)
    """Replica changes of past scale actions, for the rate-limit periods."""

    def normalize(self, now: float, rec: int, current: int) -> int:
        b = self.behavior
        self._recs.add(now, rec)
        self._recs.forget_before(now - max(b.scale_up_window_s, b.scale_down_window_s))
        up_recs = self._recs.since(now - b.scale_up_window_s) or [rec]
        down_recs = self._recs.since(now - b.scale_down_window_s) or [rec]
        # Scale up to the lowest, down to the highest recommendation of the windows.
        desired = current
        if rec > current:
            desired = max(current, min(up_recs))
        elif rec < current:
            desired = min(current, max(down_recs))
        # Rate limits: replicas added (removed) within the period count against the limit.
        added = sum(d for d in self._events.after(now - b.scale_up_period_s) if d > 0)
        removed = -sum(d for d in self._events.after(now - b.scale_down_period_s) if d < 0)
        base_up = current - added
        up_limit = max(math.ceil(base_up * (1 + b.scale_up_percent / 100)), base_up + b.scale_up_pods)
        base_down = current + removed
        down_limit = base_down - b.scale_down_pods if b.scale_down_pods is not None \
            else math.ceil(base_down * (1 - b.scale_down_percent / 100))
        desired = min(desired, up_limit) if desired > current else max(desired, down_limit)
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        if desired != current:
            self._events.add(now, desired - current)
        self._events.forget_before(now - max(b.scale_up_period_s, b.scale_down_period_s))
        return desired


@dataclass(kw_only=True)
class _Bounds:
    """The group counts a rule may ask for: ``min_replicas`` to ``max_replicas``."""

    min_replicas: int = 1
    max_replicas: int = 1


@dataclass(kw_only=True)
class _HPAControlled(_Bounds):
    """A metric fed to the HPA controller (HPA itself; KEDA, which drives an HPA): its bounds,
    tolerance and ``behavior``."""

    tolerance: float = 0.1
    behavior: HPABehavior = field(default_factory=HPABehavior)

    def __post_init__(self) -> None:
        self._core = _HPACore(self.min_replicas, self.max_replicas, self.behavior)

    def _scale(self, now: float, ratio: float, outside: int, fleet: FleetState) -> tuple[int, int]:
        """(desired, recommendation): ``outside`` groups unless the metric/target ``ratio`` is
        inside the tolerance (then the current count), normalized by the HPA controller."""
        rec = fleet.current if abs(1 - ratio) <= self.tolerance else outside
        return self._core.normalize(now, rec, fleet.current), rec


@dataclass(kw_only=True)
class HPAPolicy(_HPAControlled):
    """Kubernetes HPA on the P90 per-token latency (module docstring)."""

    target_s: float
    percentile: float = 0.9
    interval_s: float = 15.0
    window_s: float = 120.0

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        latency = obs.token_latency_quantile(self.percentile) if obs is not None else None
        if latency is None or fleet.ready == 0:
            return _hold(fleet, "no latency metric: HPA keeps the replicas")
        ratio = latency / self.target_s
        desired, rec = self._scale(now, ratio, math.ceil(ratio * fleet.ready), fleet)
        return Decision(desired, "HPA", f"ratio {ratio:.2f} x {fleet.ready} ready -> {rec}", rec)


LLMD_SLO_BEHAVIOR = HPABehavior(scale_up_window_s=30.0, scale_up_percent=100.0, scale_up_pods=4,
                                scale_up_period_s=60.0, scale_down_window_s=180.0, scale_down_period_s=120.0,
                                scale_down_pods=1)
"""The ``behavior`` of llm-d's SLO-aware ScaledObject (slo-aware-keda.md, step 3)."""


@dataclass(kw_only=True)
class KEDASLOPolicy(_HPAControlled):
    """llm-d's SLO-aware KEDA control law on the P90 per-token latency (module docstring)."""

    slo_s: float
    """The per-token SLO (seconds) the saturation is measured against."""
    theta_dn: float = 0.40
    theta_up: float = 0.55
    clamp: float = 2.0
    smooth_s: float = 45.0
    percentile: float = 0.9
    interval_s: float = 15.0
    """The recording rules' cadence (and the HPA's sync period)."""
    window_s: float = 60.0
    """The 1-minute bucket rates of the recording rules."""
    behavior: HPABehavior = field(default_factory=lambda: LLMD_SLO_BEHAVIOR)
    _recorded: Samples[float] = field(default_factory=Samples)
    """Clamped saturation of each recording, for the 45 s average."""

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        if obs is None:
            return _hold(fleet, "trigger failed: KEDA keeps the replicas")
        latency = obs.token_latency_quantile(self.percentile)
        raw = 0.0 if latency is None else latency / self.slo_s  # NaN / no traffic -> 0
        self._recorded.add(now, min(raw, self.clamp))
        self._recorded.forget_through(now - self.smooth_s)
        sat = sum(v for _, v in self._recorded) / len(self._recorded)
        n, r = max(fleet.current, 1), fleet.ready
        credit = r / n if 0 < r < n else 1.0
        if sat > self.theta_up:
            d = n + math.ceil(n * (sat * credit / self.theta_up - 1))
        elif sat < self.theta_dn:
            d = n - math.floor(n * (1 - sat / self.theta_dn))
        else:
            d = n
        desired, rec = self._scale(now, d / n, d, fleet)
        return Decision(desired, "KEDA", f"saturation {sat:.2f} (band {self.theta_dn:g}-{self.theta_up:g}), "
                                         f"credit {credit:.2f} -> {d}", rec)


# ---------------------------------------------------------------- KPA -----------------------
@dataclass
class KPAPolicy(_Bounds):
    """AIBrix KPA (Knative KPA) on concurrency per group (module docstring)."""

    target: float
    """Concurrency per group (requests running + waiting)."""
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    tolerance: float = 0.1
    scale_down_delay_s: float = 300.0
    interval_s: float = 2.0
    window_s: float | None = None
    """Reads no engine metrics: its concurrency is the gateway's (``frontend``)."""
    _samples: Samples[float] = field(default_factory=Samples)
    """Concurrency (running + waiting) of each tick of the stable window."""
    _desired: Samples[int] = field(default_factory=Samples)
    _panic_since: float | None = None
    _panic_max: int = 0
    _in_flight: float | None = None

    def frontend(self, reading: GatewayReading) -> None:
        """The requests in flight at the groups now (the queue-proxies' concurrency)."""
        self._in_flight = reading.in_flight

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        if self._in_flight is None or fleet.ready == 0:
            return _hold(fleet, "no concurrency metric: KPA keeps the replicas")
        self._samples.add(now, self._in_flight)
        self._samples.forget_through(now - self.stable_window_s)
        stable = sum(v for _, v in self._samples) / len(self._samples)
        recent = self._samples.after(now - self.panic_window_s) or [stable]
        panic = sum(recent) / len(recent)
        ready = max(1, fleet.ready)
        want_stable = math.ceil(stable / self.target)
        want_panic = math.ceil(panic / self.target)
        if abs(stable / (self.target * ready) - 1) <= self.tolerance:
            want_stable = fleet.current
        up, down = math.ceil(self.max_scale_up_rate * ready), math.floor(ready / self.max_scale_down_rate)
        want_stable = min(max(want_stable, down), up)
        want_panic = min(max(want_panic, down), up)
        over = want_panic / ready >= self.panic_threshold
        if self._panic_since is None and over:
            self._panic_since, self._panic_max = now, fleet.current
        elif self._panic_since is not None and over:
            self._panic_since = now  # stays in panic a stable window after the last over-threshold tick
        elif self._panic_since is not None and now - self._panic_since >= self.stable_window_s:
            self._panic_since = None
        if self._panic_since is not None:
            desired = max(want_panic, self._panic_max)
            self._panic_max = desired
            why = "KPAPanic"
        else:
            desired, why = want_stable, "KPA"
        # Scale-down delay: the highest desire of the last delay.
        self._desired.add(now, desired)
        self._desired.forget_before(now - self.scale_down_delay_s)
        if desired < fleet.current:
            desired = min(fleet.current, max(d for _, d in self._desired))
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        return Decision(desired, why, f"concurrency stable {stable:.1f} panic {panic:.1f} / {self.target:.2f}")


# ---------------------------------------------------------------- Dynamo planner ------------
@dataclass
class KalmanTrend:
    """Dynamo's ``kalman`` load predictor's model, a local linear trend: level ``x`` and trend
    ``v`` with ``x_t = x_{t-1} + v_{t-1} + w``, ``v_t = v_{t-1} + u``, observation ``z = x + e``;
    process noise ``q_level``, ``q_trend``, observation noise ``r`` (Dynamo's defaults), initial
    covariance 1000 I, the first observation taken as the level. Until ``min_points``
    observations the forecast is the last one."""

    q_level: float = 1.0
    q_trend: float = 0.1
    r: float = 10.0
    min_points: int = 5
    _x: tuple[float, float] | None = None
    _p: tuple[float, float, float] = (1000.0, 0.0, 1000.0)
    """Covariance (p_xx, p_xv, p_vv)."""
    _seen: int = 0
    _last: float = 0.0

    def observe(self, z: float) -> None:
        self._seen += 1
        self._last = z
        if self._x is None:
            self._x = (z, 0.0)
            return
        (x, v), (pxx, pxv, pvv) = self._predicted()
        s = pxx + self.r  # innovation variance
        kx, kv = pxx / s, pxv / s
        y = z - x
        self._x = (x + kx * y, v + kv * y)
        self._p = ((1 - kx) * pxx, (1 - kx) * pxv, pvv - kv * pxv)

    def _predicted(self) -> tuple[tuple[float, float], tuple[float, float, float]]:
        assert self._x is not None
        x, v = self._x
        pxx, pxv, pvv = self._p
        # F P F^T + Q with F = [[1, 1], [0, 1]].
        return (x + v, v), (pxx + 2 * pxv + pvv + self.q_level, pxv + pvv, pvv + self.q_trend)

    def next(self) -> float:
        """The one-step-ahead forecast (>= 0)."""
        if self._x is None or self._seen < self.min_points:
            return self._last
        return max(0.0, self._predicted()[0][0])


@dataclass
class ConstantNext:
    """Dynamo's ``constant`` load predictor: the next interval is the last one."""

    _last: float = 0.0

    def observe(self, z: float) -> None:
        self._last = z

    def next(self) -> float:
        return self._last


PREDICTORS = {"constant": ConstantNext, "kalman": KalmanTrend}


@dataclass
class DynamoPlannerPolicy(_Bounds):
    """Dynamo SLA planner, throughput-based decode scaling (module docstring)."""

    target_s: float
    """The planner's ITL target (seconds per token, a mean: Dynamo's SLA)."""
    profile: Profile
    predictor: str = "kalman"
    """``constant`` or ``kalman`` (``PREDICTORS``)."""
    interval_s: float = 180.0
    window_s: float = 180.0
    correction: bool = True
    ttft_target_s: float | None = None
    """The planner's TTFT target (seconds): with one, prefill is sized as Dynamo's planner sizes
    its prefill workers, the predicted prompt tokens/s over the prefill throughput per GPU its
    profile gives within the TTFT target (here the perf model's prefill rate, a prompt's
    prefill being well inside 2 s up to ~100k tokens: ``Profile.prefill_tokens_per_s``); an
    aggregated group does both, so the planner asks for the larger count."""
    _frontend: GatewayReading | None = None

    def __post_init__(self) -> None:
        if self.predictor not in PREDICTORS:
            raise ValueError(f"predictor {self.predictor!r}: one of {', '.join(PREDICTORS)}")
        self._num_req = PREDICTORS[self.predictor]()
        self._osl = PREDICTORS[self.predictor]()
        self._isl = PREDICTORS[self.predictor]()
        """Requests per interval and their mean output length, predicted separately (Dynamo's
        num_req and osl)."""

    def frontend(self, reading: GatewayReading) -> None:
        """The frontend's counters over the interval: requests received and their output tokens
        (Dynamo reads num_req and the mean OSL from its frontend's /metrics)."""
        self._frontend = reading

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        if obs is None:
            return _hold(fleet, "no metrics: the planner keeps the replicas")
        tokens_per_s = obs.generation_tokens / obs.window_s if obs.window_s > 0 else 0.0
        f = self._frontend
        if f is not None and f.window_s > 0 and f.requests > 0:
            self._num_req.observe(f.requests * self.interval_s / f.window_s)
            self._osl.observe(f.output_tokens / f.requests)
            self._isl.observe(f.prompt_tokens / f.requests)
            predicted = self._num_req.next() * self._osl.next() / self.interval_s
            prefill = self._num_req.next() * self._isl.next() / self.interval_s
        else:
            predicted = tokens_per_s
            prefill = obs.prefill_tokens_per_s
        corrected = self.target_s
        factor = 1.0
        step_mean = mean(obs.itl)
        if self.correction and step_mean and fleet.ready > 0 and tokens_per_s > 0:
            observed = step_mean / obs.acceptance_length
            expected = self.profile.latency_at_tokens_per_gpu(tokens_per_s / (fleet.ready * self.profile.gpus))
            factor = observed / expected if expected > 0 else 1.0
            corrected = self.target_s / factor
        per_gpu = self.profile.tokens_per_gpu_at(corrected)
        if per_gpu <= 0:
            desired = self.max_replicas
        else:
            desired = math.ceil(predicted / per_gpu / self.profile.gpus - 1e-9)
        if self.ttft_target_s is not None and self.profile.prefill_tokens_per_s > 0:
            desired = max(desired, math.ceil(prefill / self.profile.prefill_tokens_per_s - 1e-9))
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        return Decision(desired, "DynamoPlanner",
                        f"predicted {predicted:.0f} tok/s ({self.predictor}), {prefill:.0f} prompt tok/s, "
                        f"correction {factor:.2f}, {per_gpu:.0f} tok/s/GPU")


# ---------------------------------------------------------------- static / optimal ----------
@dataclass
class StaticPolicy:
    groups: int
    interval_s: float = 60.0
    window_s: float | None = None

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        return Decision(self.groups, "Static")


@dataclass
class OptimalPolicy:
    """Plays a precomputed schedule: ``active[i]`` groups (loading or ready) from minute ``i``."""

    active: list[int]
    interval_s: float = 60.0
    window_s: float | None = None

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        i = min(int(now // 60), len(self.active) - 1)
        return Decision(self.active[i], "Hindsight")


def provisioning_schedule(ready: list[int], load_minutes: int) -> list[int]:
    """Groups to hold (loading or ready) each minute so that ``ready[m]`` are ready in minute m.

    Groups are interchangeable, so slot k (the k-th group) is needed in the minutes where
    ``ready >= k``; each run of such minutes needs the group loading during the ``load_minutes``
    before it, and a gap shorter than or equal to a load time is cheaper to keep than to reload.
    Groups ready at minute 0 are there from the start (no loading before the trace)."""
    n = len(ready)
    active = [0] * n
    for k in range(1, max(ready, default=0) + 1):
        runs: list[list[int]] = []
        m = 0
        while m < n:
            if ready[m] >= k:
                start = m
                while m < n and ready[m] >= k:
                    m += 1
                if runs and start - runs[-1][1] <= load_minutes:
                    runs[-1][1] = m
                else:
                    runs.append([start, m])
            else:
                m += 1
        for start, end in runs:
            for i in range(max(0, start - load_minutes if start > 0 else 0), end):
                active[i] += 1
    return active
