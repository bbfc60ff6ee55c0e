"""Idle stop: a stop time of at least a minute, and a metric source to read the requests from."""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.api.v1alpha1 import duration_seconds

MIN_STOP_AFTER_S = 60.0
"""Shortest spec.idle.stopAfter: a few readings of the request counters (autoscaling.interval, 30s by default)."""


def stop_after_minimum(c: Candidate) -> list[SpecError]:
    after = c.spec.idle.stop_after
    return refuse(after is not None and duration_seconds(after) < MIN_STOP_AFTER_S, "spec.idle.stopAfter",
                  "idle.stopAfter must be at least 1m (e.g. 60m), or unset to never stop")


def idle_prometheus_url_required(c: Candidate) -> list[SpecError]:
    m = c.spec.autoscaling.metrics_source
    return refuse(c.spec.idle.stop_after is not None and m.type == "prometheus" and not m.prometheus_url,
                  "spec.autoscaling.metricsSource.prometheusUrl",
                  "idle.stopAfter reads requests from autoscaling.metricsSource: the prometheus source needs "
                  "autoscaling.metricsSource.prometheusUrl (or set autoscaling.metricsSource.type: podScrape)")


IDLE = Table("idle", (
    Rule(stop_after_minimum, example(idle={"stopAfter": "30s"}, autoscaling={"metricsSource": {"type": "podScrape"}}),
         cel=("idle-stop-after-minimum",)),
    Rule(idle_prometheus_url_required, example(idle={"stopAfter": "1h"}), cel=("idle-prometheus-url-required",)),
))
