"""A Grafana dashboard's Prometheus queries run as Grafana runs them, against a real Prometheus.

What Grafana does, from its code (``pkg/promlib/models/query.go``, ``pkg/promlib/intervalv2``,
grafana-plugin-sdk-go's ``gtime``; the frontend's template service and Prometheus data source):

- The time range is the dashboard's ``time`` (e.g. ``now-3h`` .. ``now``).
- ``$__interval`` = (to - from) / max data points, rounded to Grafana's steps (``round_interval``),
  never under the data source's scrape interval (its "Scrape interval" setting, 15 s when unset)
  and never under range / 11000 (Prometheus' point limit). Grafana sends the panel's width in
  pixels as max data points: here the panel's share (``gridPos.w`` of 24 columns) of a browser
  ``width_px`` wide.
- ``$__rate_interval`` = max(``$__interval`` + scrape interval, 4 x scrape interval).
- ``$__range`` = the range in whole seconds, ``<n>s``.
- A panel target without ``instant`` is a range query from ``from`` to ``to`` (both rounded down
  to a multiple of the step), with ``$__interval`` as step.
- Query variables (``label_values(<series selector>, <label>)``) are the label's values over the
  time range among the series the selector matches (``/api/v1/label/<label>/values``), resolved in
  the dashboard's order so a later one can use an earlier one. A multi-value or include-all
  variable's value is regex-escaped; "All" is its ``allValue``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser
import requests
import yaml

DEFAULT_SCRAPE_S = 15.0
"""The Prometheus data source's "Scrape interval" when unset (Grafana's default)."""
SAFE_RESOLUTION = 11000
"""Most points Grafana asks Prometheus for per series (Prometheus refuses more than 11,000)."""
ROUNDING = ((0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5), (1.5, 1), (3.5, 2),
            (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120), (450, 300), (750, 600),
            (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200), (16200, 10800), (32400, 21600),
            (86400, 43200), (604800, 86400), (1814400, 604800))
"""gtime.RoundInterval: (up to this many seconds, rounded to this many), seconds."""
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
"""Grafana's template-variable syntax ($name, [[name]], ${name}, ${name:format}): its own pattern."""
LEGEND_LABEL = re.compile(r"\{\{\s*(.+?)\s*\}\}")
"""A label in a legendFormat (``{{label}}``): the pattern Grafana renders legends with."""
REGEX_SPECIAL = set("$^*{}[]'+?.()|")


def round_interval(seconds: float) -> float:
    """Grafana's rounding of a computed interval to a readable step, seconds."""
    return next((to for up_to, to in ROUNDING if seconds <= up_to), 2592000 if seconds < 3628800 else 31536000)


def interval(range_s: float, scrape_s: float, max_data_points: int) -> float:
    """``$__interval`` and the step of a range query over ``range_s`` seconds, seconds."""
    calculated = range_s / max_data_points
    wanted = scrape_s if calculated < scrape_s else round_interval(calculated)
    return max(wanted, round_interval(range_s / SAFE_RESOLUTION))


def rate_interval(interval_s: float, scrape_s: float) -> float:
    """``$__rate_interval``, seconds."""
    return max(interval_s + scrape_s, 4 * scrape_s)


def format_interval(seconds: float) -> str:
    """gtime.FormatInterval: the largest whole unit (``5s``, ``1m``, ``500ms``): ``$__interval``."""
    for unit, size in (("y", 31536000), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(1, int(seconds * 1000))}ms"


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String (``20s``, ``1m0s``, ``1h30m0s``, ``500ms``): ``$__rate_interval``."""
    if seconds < 1:
        return f"{int(round(seconds * 1000))}ms"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else "") + f"{secs}s"


def relative_time(text: str, now: float) -> float:
    """A dashboard time (``now``, ``now-3h``) as epoch seconds."""
    if text == "now":
        return now
    if not text.startswith("now-") or not text[4:-1].isdigit() or text[-1] not in UNITS:
        raise ValueError(f"dashboard time {text!r}: only now and now-<n><{''.join(UNITS)}> are read here")
    return now - int(text[4:-1]) * UNITS[text[-1]]


def regex_escape(value: str) -> str:
    """How the Prometheus data source writes one value of a multi-value variable into a regex
    matcher: each regex metacharacter behind an escaped backslash (PromQL string syntax)."""
    return "".join("\\\\" + c if c in REGEX_SPECIAL else "\\\\\\\\" if c == "\\" else c for c in value)


def legend_labels(legend_format: str) -> list[str]:
    """The labels a legendFormat renders (``{{namespace}}/{{deployment}}`` -> both)."""
    return LEGEND_LABEL.findall(legend_format or "")


def substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each variable of ``values`` replaced (others left as they are, as Grafana does)."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        return values.get(name, m.group(0))
    return VARIABLE.sub(one, text)


def label_values_query(query: str) -> tuple[str | None, str]:
    """(series selector or None, label) of ``label_values([selector, ]label)``; the selector is
    parsed as PromQL (a bad one raises ``ValueError`` naming it)."""
    body = query.strip()
    if not (body.startswith("label_values(") and body.endswith(")")):
        raise ValueError(f"variable query {query!r}: only label_values(...) is run here")
    selector, _, label = body[len("label_values("):-1].rpartition(",")
    if not selector.strip():
        return None, label.strip()
    parsed = promql_parser.parse(selector.strip())
    if not isinstance(parsed, promql_parser.VectorSelector):
        raise ValueError(f"variable query {query!r}: {selector.strip()!r} is not a series selector")
    return str(parsed), label.strip()


def metric_names(expr: str) -> set[str]:
    """The metric names the series selectors of ``expr`` (variables substituted) select, from
    its PromQL syntax tree; a query that does not parse raises ``ValueError``."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


@dataclass(frozen=True)
class Target:
    """One query of one panel."""

    panel: str
    ref_id: str
    expr: str
    legend_format: str
    instant: bool
    width: int
    """The panel's width in dashboard columns (of 24)."""

    def __str__(self) -> str:
        return f"panel {self.panel!r} query {self.ref_id}"


def targets(dashboard: Mapping[str, Any]) -> Iterator[Target]:
    """Every Prometheus query of every panel (the panels of collapsed rows too), in order."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for t in inner.get("targets", []):
                if t.get("expr"):
                    yield Target(inner["title"], t.get("refId", "A"), t["expr"], t.get("legendFormat", ""),
                                 bool(t.get("instant")), inner["gridPos"]["w"])


class Prometheus:
    """Prometheus' HTTP API at ``url`` (queries as the data source sends them: POST, form-encoded)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _call(self, path: str, params: Mapping[str, Any] | list[tuple[str, Any]], post: bool = False) -> Any:
        """``data`` of an API answer; ``post``: the parameters as a form (the query endpoints)."""
        resp = (requests.post(self.url + path, data=params, timeout=self.timeout_s) if post else
                requests.get(self.url + path, params=params, timeout=self.timeout_s))
        try:
            body = resp.json()
        except ValueError:
            body = {"error": resp.text[:300]}
        if resp.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {resp.status_code} {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def scrape_interval_s(self) -> float:
        """The global scrape interval of the running configuration (what a data source's
        "Scrape interval" is set to)."""
        config = yaml.safe_load(self._call("/api/v1/status/config", {})["yaml"])
        text = str(config["global"]["scrape_interval"])
        return float(text[:-1]) * UNITS[text[-1]]

    def label_values(self, label: str, selector: str | None, start: float, end: float) -> list[str]:
        params: list[tuple[str, Any]] = [("start", start), ("end", end)] + ([("match[]", selector)] if selector else [])
        return sorted(self._call(f"/api/v1/label/{label}/values", params))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._call("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step},
                          post=True)["result"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return self._call("/api/v1/query", {"query": expr, "time": at}, post=True)["result"]


class PrometheusError(RuntimeError):
    """Prometheus refused a query (its error type and message)."""


class Dashboard:
    """A dashboard model (its JSON) opened at ``now`` on ``prometheus``, whose data source's scrape
    interval is ``scrape_s``, in a browser ``width_px`` pixels wide."""

    def __init__(self, model: Mapping[str, Any], prometheus: Prometheus, scrape_s: float,
                 now: float | None = None, width_px: int = 1920) -> None:
        self.model, self.prometheus, self.scrape_s, self.width_px = model, prometheus, scrape_s, width_px
        now = time.time() if now is None else now
        self.start = relative_time(model["time"]["from"], now)
        self.end = relative_time(model["time"]["to"], now)

    def variables(self, chosen: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """(name -> value written into queries, problems) for the dashboard's variables, in order.
        A query variable takes its value in ``chosen`` (which must be among those it resolves to),
        else "All" when it has it, else its first value. Problems: a variable that resolves to no
        value, or not to the value chosen."""
        values: dict[str, str] = {}
        problems: list[str] = []
        for var in self.model.get("templating", {}).get("list", []):
            if var["type"] != "query":
                continue  # the data source picker: these queries all go to ``prometheus``
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            selector, label = label_values_query(substitute(query, values))
            found = self.prometheus.label_values(label, selector, self.start, self.end)
            name = var["name"]
            if not found:
                problems.append(f"variable ${name} ({query}) resolves to no value")
            if name in chosen:
                if chosen[name] not in found:
                    problems.append(f"variable ${name} ({query}) does not offer {chosen[name]!r}: {found}")
                pick = [chosen[name]]
            elif var.get("includeAll"):
                values[name] = var.get("allValue") or "(" + "|".join(map(regex_escape, found)) + ")"
                continue
            else:
                pick = found[:1]
            multi = var.get("multi") or var.get("includeAll")
            values[name] = regex_escape(pick[0]) if multi and pick else (pick[0] if pick else "")
        return values, problems

    def run(self, target: Target, values: Mapping[str, str]) -> tuple[str, list[dict[str, Any]]]:
        """(the query as sent, its series: each ``metric`` (labels) with ``values`` or ``value``)."""
        range_s = self.end - self.start
        points = max(1, int(self.width_px * target.width / 24))
        step = interval(range_s, self.scrape_s, points)
        builtins = {"__interval": format_interval(step), "__interval_ms": str(int(step * 1000)),
                    "__rate_interval": go_duration(rate_interval(step, self.scrape_s)),
                    "__range": f"{round(range_s)}s", "__range_s": str(round(range_s)),
                    "__range_ms": str(int(range_s * 1000))}
        expr = substitute(target.expr, {**values, **builtins})
        if target.instant:
            return expr, self.prometheus.query(expr, self.end)
        start, end = (math.floor(t / step) * step for t in (self.start, self.end))
        return expr, self.prometheus.query_range(expr, start, end, step)


def problems_of(target: Target, result: list[dict[str, Any]]) -> list[str]:
    """What a panel would show wrong: no series, or series without a label its legend renders."""
    if not result:
        return [f"{target}: no series"]
    out = []
    for label in legend_labels(target.legend_format):
        lacking = [s["metric"] for s in result if not s["metric"].get(label)]
        if lacking:
            out.append(f"{target}: {len(lacking)} of {len(result)} series lack label {label!r} of legend "
                       f"{target.legend_format!r}, e.g. {lacking[0]}")
    return out
