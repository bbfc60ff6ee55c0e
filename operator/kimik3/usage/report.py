"""``kimik3 usage``: usage per tenant (namespace), deployment and hour, read from the recording rules.

``read`` asks Prometheus for each recorded series of ``kimik3.usage.rules`` once
(``/api/v1/query_range`` from the first hour's end to the last's, a step of one hour: each value
is what the rule summed over the hour ending there), and ``rows`` turns those answers into one
``Usage`` per (hour, namespace, deployment), the deployment's revisions added up. ``table``,
``csv_text`` and ``json_text`` print them with the columns of ``COLUMNS``.

Units: tokens and requests are counts (``increase()`` extrapolates to the hour's edges, so a
value may be fractional: printed rounded); GPU-hours are ``kimik3_gpu_seconds_total``'s increase
/ 3600, held ones split into reserved and burst by its ``capacity`` label; SLO minutes are one-minute readings of ``kimik3_latency_within_target`` (the autoscaler's
verdict on its last window with traffic), ``*_minutes_measured`` those with a reading at all.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3.api.conditions import Reason
from kimik3.autoscaler.observation import FINISHED_REASONS, MetricsUnavailable
from kimik3.autoscaler.sources import PrometheusClient
from kimik3.kube.groups import BURST, HELD, SERVING
from kimik3.kube.times import rfc3339
from kimik3.usage.rules import RULES, SLO_MEASURED, SLO_WITHIN, slo_record

HOUR_S = 3600

Matrix = list[dict[str, Any]]
"""A ``query_range`` answer: ``[{"metric": {labels}, "values": [[t, "<float>"], ...]}, ...]``."""


@dataclass
class Usage:
    """One deployment of one tenant over one hour (``hour``: its start, unix seconds, UTC)."""

    hour: float
    namespace: str
    deployment: str
    revisions: set[str] = field(default_factory=set)
    """Engine revisions (LeaderWorkerSet template hashes) with usage in the hour."""
    prompt_tokens: float = 0.0
    """Prompt tokens prefilled, those from the prefix cache included."""
    cached_prompt_tokens: float = 0.0
    """Of them, served from the prefix cache."""
    generation_tokens: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    """Finished requests by outcome (vLLM's ``finished_reason``)."""
    gpu_hours_held: float = 0.0
    gpu_hours_serving: float = 0.0
    gpu_hours_burst: float = 0.0
    """Of ``gpu_hours_held``, those of burst groups (above autoscaling.minReplicas with
    placement.burstPriorityClass: preemptible); the rest are reserved (``gpu_hours_reserved``)."""
    latency_minutes_within: float | None = None
    latency_minutes_measured: float | None = None
    ttft_minutes_within: float | None = None
    """None where no TTFT target is set (no reading)."""
    ttft_minutes_measured: float | None = None

    @property
    def gpu_hours_reserved(self) -> float:
        """GPU-hours held by reserved groups (every group of a deployment without burst capacity)."""
        return self.gpu_hours_held - self.gpu_hours_burst

    @property
    def serving_share(self) -> float | None:
        """GPU-hours serving / held (None when none was held)."""
        return self.gpu_hours_serving / self.gpu_hours_held if self.gpu_hours_held else None

    @staticmethod
    def _share(within: float | None, measured: float | None) -> float | None:
        return within / measured if within is not None and measured else None

    @property
    def latency_attainment(self) -> float | None:
        """Share of the measured minutes within the per-token latency target."""
        return self._share(self.latency_minutes_within, self.latency_minutes_measured)

    @property
    def ttft_attainment(self) -> float | None:
        return self._share(self.ttft_minutes_within, self.ttft_minutes_measured)


def hour_starts(start: float, end: float) -> list[float]:
    """Starts of the whole UTC hours from ``start`` (rounded down to its hour) up to ``end``
    (rounded down: an hour not over by ``end`` is left out)."""
    first, last = start - start % HOUR_S, end - end % HOUR_S
    return [float(h) for h in range(int(first), int(last), HOUR_S)]


def rolling_hour_starts(end: float, hours: int) -> list[float]:
    """Starts of the ``hours`` consecutive hours ending exactly at ``end`` (unix seconds, not
    rounded: ``hours=1`` is the past 60 minutes up to ``end``); each recorded value read at an
    hour's end holds the hour before it, whatever the clock says."""
    return [end - (hours - i) * HOUR_S for i in range(hours)]


def _points(matrix: Matrix) -> Iterable[tuple[dict[str, str], float, float]]:
    """(labels, hour start, value) of every point of a ``query_range`` answer (each point is at
    the hour's end)."""
    for series in matrix:
        labels = series.get("metric") or {}
        for point in series.get("values") or []:
            try:
                yield labels, float(point[0]) - HOUR_S, float(point[1])
            except (IndexError, TypeError, ValueError):
                raise MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"malformed point {str(point)[:200]}") from None


def rows(answers: Mapping[str, Matrix]) -> list[Usage]:
    """One ``Usage`` per (hour, namespace, deployment) found in ``answers`` (recorded name ->
    its ``query_range`` answer, as ``read`` asks them), sorted by hour, namespace, deployment."""
    out: dict[tuple[float, str, str], Usage] = {}

    def row(labels: dict[str, str], hour: float) -> Usage:
        key = (hour, labels.get("namespace", ""), labels.get("deployment", ""))
        if key not in out:
            out[key] = Usage(*key)
        return out[key]

    for key in ("prompt_tokens", "cached_prompt_tokens", "generation_tokens"):
        for labels, hour, value in _points(answers.get(RULES[key].record(), [])):
            usage = row(labels, hour)
            setattr(usage, key, getattr(usage, key) + value)
            usage.revisions.add(labels.get("revision", ""))
    for labels, hour, value in _points(answers.get(RULES["requests"].record(), [])):
        usage = row(labels, hour)
        reason = labels.get("finished_reason", "")
        usage.requests[reason] = usage.requests.get(reason, 0.0) + value
        usage.revisions.add(labels.get("revision", ""))
    for labels, hour, value in _points(answers.get(RULES["gpu_seconds"].record(), [])):
        usage = row(labels, hour)
        state = labels.get("state")
        if state == HELD:
            usage.gpu_hours_held += value / HOUR_S
            if labels.get("capacity") == BURST:
                usage.gpu_hours_burst += value / HOUR_S
        elif state == SERVING:
            usage.gpu_hours_serving += value / HOUR_S
        usage.revisions.add(labels.get("revision", ""))
    for operation, attr in ((SLO_WITHIN, "minutes_within"), (SLO_MEASURED, "minutes_measured")):
        for labels, hour, value in _points(answers.get(slo_record(operation), [])):
            target = labels.get("target")
            if target in ("latency", "ttft"):
                setattr(row(labels, hour), f"{target}_{attr}", value)
    return [out[k] for k in sorted(out)]


def queries(namespace: str | None = None) -> list[str]:
    """The recorded series ``read`` asks for (those of one namespace when given)."""
    selector = f'{{namespace="{namespace}"}}' if namespace else ""
    names = [r.record() for r in RULES.values()] + [slo_record(op) for op in (SLO_WITHIN, SLO_MEASURED)]
    return [name + selector for name in names]


def read(client: PrometheusClient, hours: list[float], namespace: str | None = None) -> list[Usage]:
    """Usage of the consecutive ``hours`` (their starts, ``hour_starts``; at least one). Raises
    ``MetricsUnavailable`` when Prometheus cannot answer."""
    answers = {}
    for promql in queries(namespace):
        answers[promql.split("{")[0]] = client.query_range(promql, hours[0] + HOUR_S, hours[-1] + HOUR_S, HOUR_S)
    return rows(answers)


COLUMNS = ("hour", "namespace", "deployment", "revisions", "prompt_tokens", "cached_prompt_tokens",
           "generation_tokens", "requests", *(f"requests_{r}" for r in FINISHED_REASONS), "gpu_hours_held",
           "gpu_hours_serving", "gpu_hours_reserved", "gpu_hours_burst", "serving_share", "latency_minutes_within", "latency_minutes_measured",
           "latency_attainment", "ttft_minutes_within", "ttft_minutes_measured", "ttft_attainment")
"""Columns of every format, in order (``requests``: every outcome, unknown ones included)."""


def record(usage: Usage) -> dict[str, Any]:
    """One row as plain values: the hour in RFC 3339 (UTC), counts rounded to whole numbers,
    GPU-hours to 3 decimals, shares to 4; None where nothing was measured."""
    def maybe(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)
    values: dict[str, Any] = {
        "hour": rfc3339(usage.hour), "namespace": usage.namespace, "deployment": usage.deployment,
        "revisions": " ".join(sorted(r for r in usage.revisions if r)),
        "prompt_tokens": round(usage.prompt_tokens), "cached_prompt_tokens": round(usage.cached_prompt_tokens),
        "generation_tokens": round(usage.generation_tokens), "requests": round(sum(usage.requests.values())),
        **{f"requests_{r}": round(usage.requests.get(r, 0.0)) for r in FINISHED_REASONS},
        "gpu_hours_held": round(usage.gpu_hours_held, 3), "gpu_hours_serving": round(usage.gpu_hours_serving, 3),
        "gpu_hours_reserved": round(usage.gpu_hours_reserved, 3), "gpu_hours_burst": round(usage.gpu_hours_burst, 3),
        "serving_share": maybe(usage.serving_share, 4),
        "latency_minutes_within": maybe(usage.latency_minutes_within, 0),
        "latency_minutes_measured": maybe(usage.latency_minutes_measured, 0),
        "latency_attainment": maybe(usage.latency_attainment, 4),
        "ttft_minutes_within": maybe(usage.ttft_minutes_within, 0),
        "ttft_minutes_measured": maybe(usage.ttft_minutes_measured, 0),
        "ttft_attainment": maybe(usage.ttft_attainment, 4),
    }
    return {c: values[c] for c in COLUMNS}


def json_text(usages: list[Usage], hours: list[float]) -> str:
    """The billing export: ``{"start", "end" (RFC 3339: the first hour's start, the last's end),
    "rows": [record, ...]}``."""
    return json.dumps({"start": rfc3339(hours[0]), "end": rfc3339(hours[-1] + HOUR_S), "rows": [record(u) for u in usages]},
                      indent=2)


def csv_text(usages: list[Usage]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for usage in usages:
        writer.writerow({k: "" if v is None else v for k, v in record(usage).items()})
    return out.getvalue()


def table(usages: list[Usage]) -> str:
    """Columns aligned with spaces (numbers to the right), ``-`` where nothing was measured."""
    cells = [list(COLUMNS)] + [["-" if v is None else str(v) for v in record(u).values()] for u in usages]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    text = {"hour", "namespace", "deployment", "revisions"}
    return "\n".join("  ".join(c.ljust(w) if name in text else c.rjust(w) for c, w, name in zip(r, widths, COLUMNS))
                     .rstrip() for r in cells) + "\n"
