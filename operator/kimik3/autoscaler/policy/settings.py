"""``LatencyPolicySettings``: the numbers of the latency policy (latency.py), in seconds, shares
of the target and standard deviations; factory.py fills them from ``spec.autoscaling``, the rest
keep the defaults measured here."""

from __future__ import annotations

from dataclasses import dataclass

from kimik3.api.v1alpha1 import LatencyMetric


@dataclass
class LatencyPolicySettings:
    target_s: float
    """Per-token latency target (seconds) at ``percentile``."""
    percentile: float = 0.9
    ttft_target_s: float | None = None
    """Time-to-first-token target (seconds) at ``ttft_percentile``; None: none (``autoscaling.ttftTarget``)."""
    ttft_percentile: float = 0.9
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
    against the demand that came) follows; the forecast is raised to at least the demand now
    grown by it (forecast.py ``Shortfall``)."""
    burst_hold_loads: float = 2.0
    """After bursts shorter than a load time (groups asked for arrive to find their demand gone),
    scale-down keeps what the bursts need during this many load times (what the first asked for,
    until the held groups have served one and measured it), so that the groups one burst brought
    serve the next one; each new burst extends it. 0 disables."""
    metric: LatencyMetric = "timePerOutputToken"
    """timePerOutputToken (per token) or interTokenLatency (raw vLLM ITL per engine step)."""
