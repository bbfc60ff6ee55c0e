"""The operator's autoscaling policy for one admitted deployment: the one way it is built.

``latency_policy(admitted)`` is what the controller keeps per deployment, what the kit's fleet
simulator drives and what the trace benchmark measures: ``LatencyPolicy`` with the settings of
``spec.autoscaling`` (``policy_settings``: durations in seconds, the percentile as a fraction,
the decision cadence), the latency model and the TTFT model seeded from the perf model for the
spec's group (autoscaler/seed.py).
"""

from __future__ import annotations

from kimik3.admission import Admitted
from kimik3.autoscaler.policy import LatencyPolicy, LatencyPolicySettings
from kimik3.autoscaler.seed import seed_model, seed_ttft


def policy_settings(admitted: Admitted) -> LatencyPolicySettings:
    """The latency policy's settings from ``spec.autoscaling``: target (seconds) at the
    percentile (as a fraction), the TTFT target likewise when set, min/max groups, stabilization windows, decision interval and
    observation window (seconds), metric."""
    a, seconds = admitted.spec.autoscaling, admitted.seconds
    return LatencyPolicySettings(
        target_s=seconds.latency_target, percentile=admitted.target_quantile,
        ttft_target_s=seconds.ttft_target,
        ttft_percentile=a.ttft_target.percentile / 100 if a.ttft_target is not None else 0.9,
        interval_s=seconds.autoscaling_interval, window_s=seconds.autoscaling_window,
        min_replicas=a.min_replicas, max_replicas=a.max_replicas,
        scale_up_window_s=seconds.scale_up_stabilization,
        scale_down_window_s=seconds.scale_down_stabilization,
        metric=a.target.metric)


def latency_policy(admitted: Admitted) -> LatencyPolicy:
    """A fresh policy for ``admitted`` (no history: the model starts from its seed)."""
    return LatencyPolicy(policy_settings(admitted), seed_model(admitted), seed_ttft(admitted))
