"""Decode-latency autoscaling: a replica range that is one, a place to read metrics from, a TTFT target above 0."""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.api.v1alpha1 import duration_seconds


def min_replicas_at_most_max(c: Candidate) -> list[SpecError]:
    a = c.spec.autoscaling
    return refuse(a.min_replicas > a.max_replicas, "spec.autoscaling.minReplicas", "minReplicas must be <= maxReplicas")


def prometheus_url_required(c: Candidate) -> list[SpecError]:
    a = c.spec.autoscaling
    return refuse(a.enabled and a.metrics_source.type == "prometheus" and not a.metrics_source.prometheus_url,
                  "spec.autoscaling.metricsSource.prometheusUrl",
                  "autoscaling with the prometheus source needs autoscaling.metricsSource.prometheusUrl")


def ttft_target_positive(c: Candidate) -> list[SpecError]:
    t = c.spec.autoscaling.ttft_target
    return refuse(t is not None and duration_seconds(t.value) <= 0, "spec.autoscaling.ttftTarget.value",
                  "ttftTarget.value must be above 0 (e.g. 2s)")


AUTOSCALING = Table("autoscaling", (
    Rule(min_replicas_at_most_max, example(autoscaling={"minReplicas": 3, "maxReplicas": 2}),
         cel=("autoscaling-min-le-max",)),
    Rule(prometheus_url_required, example(autoscaling={"enabled": True, "metricsSource": {"type": "prometheus"}}),
         cel=("prometheus-url-required",)),
    Rule(ttft_target_positive, example(autoscaling={"ttftTarget": {"value": "0s"}}), cel=("ttft-target-positive",)),
))
