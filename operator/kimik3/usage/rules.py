"""Recording rules that turn the engines' and the operator's counters into hourly usage.

Each rule is ``sum by (<level>) (increase(<counter>[1h]))`` (or, for SLO minutes, a
one-minute subquery over the operator's ``kimik3_latency_within_target``), named in Prometheus'
``level:metric:operations`` convention (https://prometheus.io/docs/practices/rules/). Evaluated
at the end of an hour, a series holds what was counted in that hour:

- **engine restarts**: ``increase()`` treats a counter going down as a reset and counts from
  zero, where a sum of raw counters would lose everything before;
- **scrape gaps** (an engine, the operator or Prometheus unreachable for a while): a counter is
  cumulative, so the increase across the gap is still counted once samples on both sides lie
  in the hour; the operator's GPU time is a counter for this reason (``kimik3_gpu_seconds_total``,
  ``controller.metrics.GpuTime``), not a gauge integrated here;
- **a group or deployment deleted mid-hour**: its series end, and ``increase()`` counts it up to
  its last sample; ``sum by`` then adds it to the groups still running.

Sources: vLLM 0.33's counters as the PodMonitor relabels them (``render.podmonitor``: labels
``namespace``, ``deployment``, ``group``, ``revision``), and the operator's own series (labels
``namespace``, ``deployment``, ``revision``, and for GPU time ``state`` and ``capacity``; the chart's ServiceMonitor keeps them with
``honorLabels``). ``prometheus_rule`` wraps the groups as a PrometheusRule (the Helm chart ships
it, ``kimik3 usage-rules`` writes it, the dev cluster applies it); ``kimik3.usage.report`` reads
the recorded series back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimik3.autoscaler.observation import GENERATION_TOKENS, PREFIX_CACHE_HITS, PROMPT_TOKENS, REQUEST_SUCCESS

PERIOD = "1h"
"""The billing period each rule sums over (a Prometheus duration)."""
SLO_STEP = "1m"
"""Resolution of the SLO minutes: the operator's verdict is read once a minute."""
GROUP_NAME = "kimik3-usage"
"""The rule group's name."""
USAGE_LEVEL = ("namespace", "deployment", "revision")
"""Labels every usage series keeps: the tenant, its deployment, the engine revision."""


@dataclass(frozen=True)
class UsageRule:
    """One recorded series: ``key`` names it in the report, ``source`` is the counter (its
    exposed name, with ``_total``), ``by`` the labels kept beyond ``USAGE_LEVEL``."""

    key: str
    source: str
    by: tuple[str, ...] = ()
    help: str = ""

    def record(self, period: str = PERIOD) -> str:
        """``<level>:<metric>:increase<period>``, e.g.
        ``namespace_deployment_revision:vllm_prompt_tokens:increase1h``."""
        metric = self.source.removesuffix("_total").replace(":", "_")
        return f"{'_'.join(USAGE_LEVEL + self.by)}:{metric}:increase{period}"

    def expr(self, period: str = PERIOD) -> str:
        return f"sum by ({', '.join(USAGE_LEVEL + self.by)}) (increase({self.source}[{period}]))"


USAGE_RULES = (
    UsageRule("prompt_tokens", f"{PROMPT_TOKENS}_total", help="prompt tokens prefilled, cached ones included"),
    UsageRule("generation_tokens", f"{GENERATION_TOKENS}_total", help="tokens generated"),
    UsageRule("cached_prompt_tokens", f"{PREFIX_CACHE_HITS}_total",
              help="prompt tokens served from the prefix cache (vllm:prefix_cache_hits, present in 0.32 and 0.33)"),
    UsageRule("requests", f"{REQUEST_SUCCESS}_total", ("finished_reason",),
              help="finished requests by outcome (vLLM's finished_reason: stop, length, abort, error, repetition)"),
    UsageRule("gpu_seconds", "kimik3_gpu_seconds_total", ("state", "capacity"),
              help="GPU-seconds held (bound pods, loading included) and serving (Ready groups), of reserved "
                   "and burst groups"),
)
"""What is billed, by report key."""
RULES = {rule.key: rule for rule in USAGE_RULES}

SLO_SOURCE = "kimik3_latency_within_target"
SLO_LEVEL = ("namespace", "deployment", "target")
SLO_WITHIN = "sum_over_time"
"""Operation of the series holding the minutes of the hour whose reading met the target
(label ``target``: latency, ttft)."""
SLO_MEASURED = "count_over_time"
"""Operation of the series holding the minutes of the hour with a reading (a window with traffic)."""


def slo_record(operation: str, period: str = PERIOD) -> str:
    """``namespace_deployment_target:kimik3_latency_within_target:<operation><period>``."""
    return f"{'_'.join(SLO_LEVEL)}:{SLO_SOURCE}:{operation}{period}"


def rule_groups(period: str = PERIOD) -> dict[str, Any]:
    """The rule file's content (Prometheus' ``groups:`` format, also a PrometheusRule's spec).
    ``period``: the billing period (tests use a short one; the recorded names carry it)."""
    rules: list[dict[str, Any]] = [{"record": r.record(period), "expr": r.expr(period)} for r in USAGE_RULES]
    rules += [{"record": slo_record(op, period),
               "expr": f"sum by ({', '.join(SLO_LEVEL)}) ({op}({SLO_SOURCE}[{period}:{SLO_STEP}]))"}
              for op in (SLO_WITHIN, SLO_MEASURED)]
    return {"groups": [{"name": GROUP_NAME, "rules": rules}]}


def prometheus_rule(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The PrometheusRule (monitoring.coreos.com/v1) holding ``rule_groups()``; ``labels`` are
    what the Prometheus resource's ``ruleSelector`` matches."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": rule_groups()}
