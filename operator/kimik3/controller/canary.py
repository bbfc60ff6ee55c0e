"""Canary analysis: the new revision's decode latency and error rate, read apart from the old groups'.

``Analysis.check(namespace, name, admitted, revision, pods)`` reads the window since the last
check (``rollout.canary.analysis.interval``) from the metric source ``spec.autoscaling.metricsSource``
names (whether or not autoscaling is on), restricted to the groups of ``revision``:
- ``prometheus``: the series with ``revision="<rev>"`` (the PodMonitor copies the leader pods'
  ``leaderworkerset.sigs.k8s.io/template-revision-hash`` label into ``revision``;
  ``render/podmonitor.py``);
- ``podScrape``: only the leaders whose revision label is ``revision``, scraped as the autoscaler
  scrapes (``autoscaler.sources.PodScrapeSource``, the same URL resolver).
The latency is ``autoscaling.target.metric`` at ``autoscaling.target.percentile`` (per output
token by default), held under ``rollout.canary.analysis.maxLatency`` (default the autoscaling
target); the error rate is ``finished_reason="error"`` over every finished request, held under
``maxErrorRate``. Each check has a ``result`` (``CheckResult``):
- ``Passed`` / ``Failed``: a window with traffic, judged against both limits;
- ``NoTraffic``: the source answered, but no request ran in the window; ``NoReading``: the source
  works but has no window yet (pod scrape: the first scrape of a leader, ``WarmingUp``; no Running
  leader of the revision, ``NoTargets``). Neither passes nor fails the release, and neither counts
  towards ``minChecks``;
- ``SourceUnreadable``: the source failed (Prometheus unreachable or erring, no series of the
  revision, every scrape failing, no latency histogram, bucket layouts that differ): the rollout
  pauses (``controller.rollout``) and the canary is never promoted on it.

Probe requests (``Analysis.probe``): once a window had no traffic, ``controller.rollout`` has the
analysis send ``analysis.probeRequests`` requests of its own (golden prompts, greedy,
``parity.maxTokens`` tokens each: bounded) to the canary groups' leaders at every later check, so
the next window has something to judge; counted in ``kimik3_canary_probe_requests_total
{purpose="traffic"}``. Output parity (``controller.parity``) runs with the same client
(``Analysis.parity``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import Reason
from kimik3.api.v1alpha1 import CheckResult
from kimik3.autoscaler.observation import MetricsUnavailable
from kimik3.autoscaler.sources import MetricSource, PodScrapeSource, PrometheusSource, ScrapeTarget
from kimik3.controller import metrics
from kimik3.controller.completions import CompletionFailed, Completions, Greedy
from kimik3.controller.parity import GOLDEN_PROMPTS, ConfigMapReader, Parity
from kimik3.kube.labels import LWS_REVISION_LABEL
from kimik3.kube.pods import group_index, is_leader, labels, phase

ScrapeURL = Callable[[dict[str, Any], int], str]


NO_READING_YET: tuple[Reason, ...] = (Reason.WARMING_UP, Reason.NO_TARGETS)
"""``MetricsUnavailable`` reasons of a source that works but has no window yet: no reading, not a failure."""


@dataclass(frozen=True)
class Check:
    """One analysis check of the new revision."""

    result: CheckResult
    latency_seconds: float | None
    """Per-token latency at the autoscaling percentile over the window, seconds; None without traffic."""
    error_rate: float | None
    """Share of the window's finished requests that failed; None when none finished."""
    message: str
    requests: float | None = None
    """Requests of the revision finished in the window (the source's ``vllm:request_success`` increase)."""

    @property
    def judged(self) -> bool:
        """Passed or Failed: a window with traffic and a reading."""
        return self.result in ("Passed", "Failed")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


class Analysis:
    """The metric sources of every canary under way (one per deployment and revision)."""

    def __init__(self, scrape_url: ScrapeURL, clock: Callable[[], float] = time.time, greedy: Greedy | None = None,
                 config_maps: ConfigMapReader = lambda namespace, name: None):
        self.scrape_url = scrape_url
        self.clock = clock
        self.greedy = greedy or Completions().greedy
        """Greedy completions from a leader (``controller.completions``): probes and parity."""
        self.parity = Parity(self.greedy, config_maps)
        """Output parity rounds (``controller.parity``); ``config_maps`` reads a prompts ConfigMap."""
        self._sources: dict[tuple[str, str], tuple[tuple[str, str | None, int, str], MetricSource]] = {}
        self._pods: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._sources.pop((namespace, name), None)
        self._pods.pop((namespace, name), None)

    def _source(self, key: tuple[str, str], admitted: Admitted, revision: str) -> MetricSource:
        spec = admitted.spec
        m = spec.autoscaling.metrics_source
        config = (m.type, m.prometheus_url, spec.service.port, revision)
        held = self._sources.get(key)
        if held is not None and held[0] == config:
            return held[1]
        source: MetricSource
        if m.type == "prometheus":
            source = PrometheusSource(m.prometheus_url or "", clock=self.clock, match={"revision": revision})
        else:
            port = spec.service.port

            def targets(namespace: str, name: str) -> list[ScrapeTarget]:
                return [ScrapeTarget(p["metadata"].get("uid", p["metadata"]["name"]), group_index(p) or "0",
                                     self.scrape_url(p, port))
                        for p in self._pods.get(key, []) if is_leader(p) and phase(p) == "Running"
                        and labels(p).get(LWS_REVISION_LABEL) == revision]
            source = PodScrapeSource(targets, clock=self.clock)
        self._sources[key] = (config, source)
        return source

    def check(self, namespace: str, name: str, admitted: Admitted, revision: str,
              pods: list[dict[str, Any]]) -> Check:
        """One check of ``revision``'s groups over the last analysis interval (module docstring)."""
        key = (namespace, name)
        self._pods[key] = pods
        canary = admitted.spec.rollout.canary
        assert canary is not None and admitted.seconds.canary_interval is not None  # only called with a canary
        target = admitted.spec.autoscaling.target
        limit = admitted.seconds.canary_max_latency or admitted.seconds.latency_target
        try:
            obs = self._source(key, admitted, revision).observe(namespace, name, admitted.seconds.canary_interval)
        except MetricsUnavailable as exc:
            result: CheckResult = "NoReading" if exc.reason in NO_READING_YET else "SourceUnreadable"
            return Check(result, None, None, f"no reading of revision {revision} from {self.describe(admitted)} "
                                             f"({exc.reason}: {exc.message})")
        if not obs.has_traffic:
            return Check("NoTraffic", None, None, f"no traffic on revision {revision} in the window: nothing to judge",
                         obs.requests_finished)
        latency = obs.latency_quantile(target.metric, admitted.target_quantile)
        errors = obs.error_rate
        figures = (f"P{target.percentile} {target.metric} {ms(latency) if latency is not None else 'n/a'} "
                   f"(limit {ms(limit)}), error rate {f'{errors:.1%}' if errors is not None else 'n/a'} "
                   f"(limit {canary.analysis.max_error_rate:.1%}) over {obs.requests_finished:g} finished request(s)")
        slow = latency is not None and latency > limit
        failing = errors is not None and errors > canary.analysis.max_error_rate
        if slow or failing:
            return Check("Failed", latency, errors, f"revision {revision} failed a check: {figures}", obs.requests_finished)
        return Check("Passed", latency, errors, f"revision {revision} passed a check: {figures}", obs.requests_finished)

    def probe(self, namespace: str, name: str, admitted: Admitted, leaders: list[str]) -> int:
        """Send ``analysis.probeRequests`` greedy requests (the golden prompts in turn,
        ``parity.maxTokens`` tokens) to the canary ``leaders`` (base URLs) in turn, concurrently;
        returns how many were answered (each counted in ``kimik3_canary_probe_requests_total``)."""
        canary = admitted.spec.rollout.canary
        assert canary is not None
        if not leaders or not canary.analysis.probe_requests:
            return 0
        model, tokens = admitted.spec.model.served_model_name, canary.parity.max_tokens

        def send(i: int) -> bool:
            try:
                self.greedy(leaders[i % len(leaders)], model, GOLDEN_PROMPTS[i % len(GOLDEN_PROMPTS)], tokens)
            except CompletionFailed:
                metrics.CANARY_PROBE_REQUESTS.labels(namespace, name, "traffic", "failed").inc()
                return False
            metrics.CANARY_PROBE_REQUESTS.labels(namespace, name, "traffic", "ok").inc()
            return True
        with ThreadPoolExecutor(max_workers=min(8, canary.analysis.probe_requests)) as pool:
            return sum(pool.map(send, range(canary.analysis.probe_requests)))

    @staticmethod
    def describe(admitted: Admitted) -> str:
        """The metric source in words: ``Prometheus at <url>`` or ``pod scrape of the leaders``."""
        m = admitted.spec.autoscaling.metrics_source
        return f"Prometheus at {m.prometheus_url}" if m.type == "prometheus" else "pod scrape of the leaders"
