"""Decode-latency autoscaling: a replica range that is one, and a place to read metrics from."""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError


def min_replicas_at_most_max(c: Candidate) -> list[SpecError]:
    a = c.spec.autoscaling
    return refuse(a.min_replicas > a.max_replicas, "spec.autoscaling.minReplicas", "minReplicas must be <= maxReplicas")


def prometheus_url_required(c: Candidate) -> list[SpecError]:
    a = c.spec.autoscaling
    return refuse(a.enabled and a.metrics_source.type == "prometheus" and not a.metrics_source.prometheus_url,
                  "spec.autoscaling.metricsSource.prometheusUrl",
                  "autoscaling with the prometheus source needs autoscaling.metricsSource.prometheusUrl")


AUTOSCALING = Table("autoscaling", (
    Rule(min_replicas_at_most_max, example(autoscaling={"minReplicas": 3, "maxReplicas": 2}),
         cel=("autoscaling-min-le-max",)),
    Rule(prometheus_url_required, example(autoscaling={"enabled": True, "metricsSource": {"type": "prometheus"}}),
         cel=("prometheus-url-required",)),
))
