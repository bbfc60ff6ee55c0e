"""Metric sources behind one interface: ``observe(namespace, deployment, window_s)``.

- ``PrometheusSource``: PromQL over Prometheus' HTTP API (``requests``; the JSON answer is
  decoded by the library, no hand-written parser). Series are selected by the labels the
  PodMonitor gives (``namespace``, ``deployment``, ``group``; see render/podmonitor.py).
- ``PodScrapeSource``: GETs each group leader's ``/metrics``, parses it with prometheus-client's
  parser and differences the histograms and counters against the scrape of the same pod that
  starts the window (the newest one at least ``window_s`` old, as Prometheus' ``increase()``
  over the window; the oldest kept while the pod is younger than the window). A leader that
  refused the connection (nothing listens: vLLM still loading, or restarting) served nothing
  then: its first page after that is differenced against zero counters at that time, so a group
  that just became ready counts from its first token, not from its second scrape. A leader no
  longer listed (scaled down, deleted) still counts what it served inside the window, up to its
  last page.

A group's counters cover the window (``DecodeObservation.covered``; every serving group must for
the reading to be whole) when each of its pods' spans covers the reading's window (the longest
span of the pods counted from a page: right after the operator starts, every pod's span is the
same shorter one, and the reading is a whole one of that span), or the pod counts from a known
zero (it refused since before the window's start: nothing served), no scrape of it failed inside
its span (a gap) and no counter went down (an engine restarted: what it served before is lost). ``PrometheusSource``: when the group's output-token counter has a sample at the
window's start (Prometheus marks a series stale when a scrape fails or the series is gone, so a
gap or a group that joined reads absent) and now, and ``resets()`` finds none inside. Prometheus
cannot tell a target that refused (loading: nothing served) from a gap, so there a group that
just joined leaves the readings of one window partial.

Both return a ``DecodeObservation`` or raise ``MetricsUnavailable`` (hold, and say why).
"""

from __future__ import annotations

import json

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import requests
from prometheus_client.parser import text_string_to_metric_families

from kimik3.api.conditions import Reason
from kimik3.autoscaler.histogram import INF, Histogram, LayoutMismatch, merge
from kimik3.autoscaler.observation import (ACCEPTED, DRAFTS, FAILED_REASON, GENERATION_TOKENS, ITL, ITL_OLD,
                                           PREFIX_CACHE_HITS, PROMPT_TOKENS, REQUEST_SUCCESS, RUNNING, TTFT,
                                           DecodeObservation, MetricsUnavailable)
from kimik3.engine.metrics import KV_USAGE, WAITING
from kimik3.autoscaler.window import Samples

HTTP_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""A /metrics or PromQL answer larger than this is refused (a guard against runaway label sets)."""
WINDOW_SLACK = 0.05
"""A scrape up to this share of the window younger than the window still starts it: decisions
come a little early or late, and a window of 2 min must not become 2.5 min for 10 ms."""


class MetricSource(Protocol):
    def observe(self, namespace: str, deployment: str, window_s: float) -> DecodeObservation: ...


# ---------------------------------------------------------------- exposition parsing -------

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Scrape:
    """One parsed /metrics page: histograms and scalar samples per (name, labels)."""

    histograms: dict[SeriesKey, Histogram]
    scalars: dict[SeriesKey, float]

    def histograms_named(self, name: str) -> list[Histogram]:
        return [h for (n, _), h in self.histograms.items() if n == name]

    def total(self, name: str) -> float:
        return sum(v for (n, _), v in self.scalars.items() if n == name)

    def values(self, name: str) -> list[float]:
        return [v for (n, _), v in self.scalars.items() if n == name]


def parse_scrape(text: str) -> Scrape:
    """Parse Prometheus text exposition (prometheus-client's parser). Counter samples are keyed
    without their ``_total`` suffix; histogram buckets are gathered per series (labels minus le).
    Raises ValueError on malformed text."""
    buckets: dict[SeriesKey, dict[float, float]] = {}
    sums: dict[SeriesKey, float] = {}
    scalars: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if family.type == "histogram":
                key = (family.name, labels)
                if s.name.endswith("_bucket"):
                    if "le" not in s.labels:
                        raise ValueError(f"{s.name}{{{', '.join(f'{k}={v}' for k, v in labels)}}}: bucket without le")
                    buckets.setdefault(key, {})[float(s.labels["le"])] = s.value
                elif s.name.endswith("_sum"):
                    sums[key] = s.value
            elif family.type in ("counter", "gauge", "untyped", "unknown") and not s.name.endswith("_created"):
                # Counters are keyed without "_total", whether the TYPE line carried it or not.
                name = s.name[:-len("_total")] if s.name.endswith("_total") else s.name
                scalars[(name, labels)] = s.value
    return Scrape({k: Histogram(b, sums.get(k, 0.0)) for k, b in buckets.items()}, scalars)


def _itl_name(scrape: Scrape) -> str:
    """ITL, else the deprecated name; never both (F8). Empty when neither is exposed."""
    return next((name for name in (ITL, ITL_OLD) if scrape.histograms_named(name)), "")


# ---------------------------------------------------------------- pod scrape ----------------


@dataclass(frozen=True)
class ScrapeTarget:
    """A group leader to scrape: ``key`` identifies the pod incarnation (its UID)."""

    key: str
    group: str
    url: str


class HTTPPages:
    """GETs a /metrics page over HTTP (``requests``): its text. Raises ``requests.RequestException``
    (unreachable, HTTP error status) or ValueError (a page over ``MAX_RESPONSE_BYTES``)."""

    def __init__(self, session: requests.Session | None = None):
        self.session = session or requests.Session()

    def __call__(self, url: str) -> str:
        response = self.session.get(url, timeout=HTTP_TIMEOUT_S, stream=True)
        response.raise_for_status()
        body = response.raw.read(MAX_RESPONSE_BYTES + 1, decode_content=True)
        if len(body) > MAX_RESPONSE_BYTES:
            raise ValueError(f"/metrics larger than {MAX_RESPONSE_BYTES} bytes")
        return body.decode("utf-8", errors="replace")



def _growth(who: str, new: Scrape, old: Scrape, name: str, share: float) -> list[tuple[str, Histogram]]:
    """Each series of histogram ``name`` in ``new``: its growth since ``old`` (a series ``old`` lacks
    grows from empty), times ``share``, named for ``who`` (``_series``)."""
    return [(_series(who, series), (h - old.histograms.get(series, Histogram())) * share)
            for series, h in new.histograms.items() if series[0] == name]

class PodScrapeSource:
    """Scrapes leaders' /metrics; the window of each pod runs from its scrape that starts
    ``window_s`` (module docstring) to this one.

    ``targets(namespace, deployment)`` lists the leaders to scrape (the controller builds it from
    the leader pods; the URL resolver decides the address: pod IP in a cluster, a loopback port
    for the simulator). ``fetch(url)`` returns a page's text (``HTTPPages`` by default; the kit's
    fleet simulator serves its groups' pages without a socket) and raises
    ``requests.RequestException`` or ValueError when it cannot. A pod seen for the first time
    gives no window yet; its gauges count, and its group counts as reporting."""

    def __init__(self, targets: Callable[[str, str], Iterable[ScrapeTarget]],
                 fetch: Callable[[str], str] | None = None, clock: Callable[[], float] = time.time):
        self.targets = targets
        self.fetch = fetch or HTTPPages()
        self.clock = clock
        self._scrapes: dict[str, Samples[Scrape]] = {}
        """Scrapes of each pod (by key), from the one that starts the current window on."""
        self._refused: dict[str, float] = {}
        """When each pod (by key) first refused the connection, while it has no scrape since."""
        self._failed: dict[str, float] = {}
        """When each pod (by key) last failed a scrape otherwise (an HTTP error, a timeout)."""

    def observe(self, namespace: str, deployment: str, window_s: float) -> DecodeObservation:
        targets = list(self.targets(namespace, deployment))
        if not targets:
            raise MetricsUnavailable(Reason.NO_TARGETS, "no group leader to scrape")
        now = self.clock()
        start = now - window_s * (1 - WINDOW_SLACK)
        deltas, fresh, errors, uncovered, gaps, spans = self._scrape(targets, now, start)
        retired = self._retire({t.key for t in targets}, start)
        if not deltas:
            if errors:
                raise MetricsUnavailable(Reason.SCRAPE_FAILED, "; ".join(errors))
            raise MetricsUnavailable(Reason.WARMING_UP, "first scrape of every leader: no window yet")
        itl: list[tuple[str, Histogram]] = []
        ttft: list[tuple[str, Histogram]] = []
        names = set()
        drafts = accepted = tokens = prompt = hits = running = waiting = finished = failed = 0.0
        kv: list[float] = []
        # A pod whose scrapes failed inside its span (a gap: its page starting the window may be
        # much older) counts at its rate over the window, and is not covered: the reading is partial.
        # The window: the longest span of the pods scraped through it from a page (a pod counting
        # from a known zero served nothing before it refused: its span says nothing of the window).
        window = max([span for g, span in spans if g not in gaps] or [d[3] for d in deltas if d[0] not in gaps]
                     or [now - start])
        # A pod covers the reading's window when its own span does (every pod scraped since the
        # operator started: the same shorter span, a whole reading of it), or it counts from a
        # known zero (it refused since before the window's start).
        uncovered |= {g for g, span in spans if span < window * (1 - WINDOW_SLACK) - 1e-6}
        shares = [min(1.0, window / d[3]) if d[0] in gaps else 1.0 for d in deltas]
        for who, new, old, share in [(f"group {d[0]}", d[1], d[2], share) for d, share in zip(deltas, shares)] \
                + [(*r, 1.0) for r in retired]:
            name = _itl_name(new)
            if name:
                names.add(name)
                itl += _growth(who, new, old, name, share)
            ttft += _growth(who, new, old, TTFT, share)
            drafts += share * _counter_delta(new, old, DRAFTS)
            accepted += share * _counter_delta(new, old, ACCEPTED)
            tokens += share * _counter_delta(new, old, GENERATION_TOKENS)
            prompt += share * _counter_delta(new, old, PROMPT_TOKENS)
            hits += share * _counter_delta(new, old, PREFIX_CACHE_HITS)
            finished += share * _counter_delta(new, old, REQUEST_SUCCESS)
            failed += share * _counter_delta(new, old, REQUEST_SUCCESS, ("finished_reason", FAILED_REASON))
        for _, new in [(d[0], d[1]) for d in deltas] + fresh:  # gauges need no window: a first scrape counts
            running += new.total(RUNNING)
            waiting += new.total(WAITING)
            kv += new.values(KV_USAGE)
        if not names:
            raise MetricsUnavailable(Reason.NO_LATENCY_METRIC, f"leaders expose neither {ITL} nor {ITL_OLD}")
        itl_metric = ITL if ITL in names else ITL_OLD
        return DecodeObservation(
            at=now, window_s=window, itl=_merged(itl_metric, itl), itl_metric=itl_metric,
            ttft=_merged(TTFT, ttft), running=running, waiting=waiting, kv_usage=max(kv) if kv else None,
            drafts=drafts, accepted=accepted, generation_tokens=tokens, prompt_tokens=prompt,
            prefix_cache_hits=hits, requests_finished=finished,
            requests_failed=failed, groups=frozenset(d[0] for d in deltas) | frozenset(g for g, _ in fresh),
            covered=frozenset(d[0] for d in deltas) - uncovered)

    def _scrape(self, targets: list[ScrapeTarget], now: float, start: float
                ) -> tuple[list[tuple[str, Scrape, Scrape, float]], list[tuple[str, Scrape]], list[str], set[str],
                           set[str], list[tuple[str, float]]]:
        """Scrape every target: (group, page, the page starting its window, seconds between) of
        those with a window; (group, page) of those scraped the first time; the errors; the
        groups a target of which does not cover the window (module docstring); the groups a
        target of which failed a scrape since the page starting its window (a gap); (group, span)
        of the targets whose window starts at a page (not at a known zero), to compare with the
        reading's window."""
        deltas: list[tuple[str, Scrape, Scrape, float]] = []
        fresh: list[tuple[str, Scrape]] = []
        errors = []
        uncovered: set[str] = set()
        gaps: set[str] = set()
        short: list[tuple[str, float]] = []
        """Pods with a page starting their window (not a known zero), and their spans."""
        for t in targets:
            try:
                scrape = parse_scrape(self.fetch(t.url))
            except (requests.RequestException, ValueError) as exc:
                errors.append(f"group {t.group}: {type(exc).__name__}: {str(exc)[:200]}")
                uncovered.add(t.group)
                if _refused(exc):  # not serving: its counters start again from zero
                    self._scrapes.pop(t.key, None)
                    self._refused.setdefault(t.key, now)
                else:
                    self._failed[t.key] = now
                continue
            history = self._scrapes.get(t.key)
            if history is None:
                history = self._scrapes[t.key] = Samples()
                if t.key in self._refused:
                    # Nothing served since it first refused: zero counters from then, or from
                    # the window's start if that is later (the window never grows past its length).
                    history.add(max(self._refused.pop(t.key), start), NOTHING_SERVED)
            base = history.base(start)
            history.add(now, scrape)
            if base is not None:
                history.forget_before(base[0])
                deltas.append((t.group, scrape, base[1], now - base[0]))
                if self._failed.get(t.key, base[0]) > base[0]:
                    gaps.add(t.group)
                if t.group in gaps or _reset([page for _, page in history]):
                    uncovered.add(t.group)
                elif base[1] is not NOTHING_SERVED or base[0] > start + 1e-6:
                    short.append((t.group, now - base[0]))
            else:
                fresh.append((t.group, scrape))
                uncovered.add(t.group)
        return deltas, fresh, errors, uncovered, gaps, short

    def _retire(self, live: set[str], start: float) -> list[tuple[str, Scrape, Scrape]]:
        """(who, last page, the page starting the window) of pods no longer scraped (deleted, scaled
        down) whose last page is inside the window: what they served there still counts, as a
        series that ended inside the range does in Prometheus' ``increase()``. Pods whose last
        page is older are forgotten."""
        retired = []
        for key in [k for k in self._refused if k not in live]:
            del self._refused[key]
        for key in [k for k in self._failed if k not in live]:
            del self._failed[key]
        for key, history in list(self._scrapes.items()):
            if key in live:
                continue
            last_t, last = next(reversed(history))
            base = history.base(start)
            if base is None or base[0] >= last_t:
                del self._scrapes[key]
            else:
                history.forget_before(base[0])
                retired.append((f"the retired leader {key}", last, base[1]))
        return retired


def _series(who: str, series: SeriesKey) -> str:
    """``group 0 {engine="1"}``: a series named for messages."""
    return f"{who} {{{', '.join(f'{k}={v!r}' for k, v in series[1])}}}" if series[1] else who


def _merged(name: str, series: list[tuple[str, Histogram]]) -> Histogram:
    """``histogram.merge`` of one metric's series; different bucket bounds (F21b) hold replicas."""
    try:
        return merge(series)
    except LayoutMismatch as exc:
        raise MetricsUnavailable(Reason.BUCKET_LAYOUTS_DIFFER, f"{name}: {exc}") from None


NOTHING_SERVED = Scrape({}, {})
"""The counters of an engine before it served: every series at zero."""


def _refused(exc: BaseException) -> bool:
    """The connection was refused (``ConnectionRefusedError`` somewhere in the exception's
    arguments or chain): nothing listened, as while vLLM loads. A timeout or an HTTP error is
    not: a serving engine may answer late."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return True
        if isinstance(e, requests.Timeout):
            return False
        todo += [*e.args, e.__cause__, e.__context__, getattr(e, "reason", None)]
    return False


COVERAGE_COUNTERS = (GENERATION_TOKENS,)
"""Counters whose going down between two pages of a pod means its engine restarted (the window
then lacks what it served before)."""


def _reset(pages: list[Scrape]) -> bool:
    """Some series of ``COVERAGE_COUNTERS`` went down between two successive ``pages``."""
    for old, new in zip(pages, pages[1:]):
        for key, value in new.scalars.items():
            if key[0] in COVERAGE_COUNTERS and value < old.scalars.get(key, 0.0):
                return True
    return False


def _counter_delta(new: Scrape, old: Scrape, name: str, label: tuple[str, str] | None = None) -> float:
    """Increase of counter ``name`` between two pages, summed over its series (those carrying
    ``label``, a (name, value) pair, when given)."""
    total = 0.0
    for key, value in new.scalars.items():
        if key[0] == name and (label is None or label in key[1]):
            before = old.scalars.get(key, 0.0)
            total += value - before if value >= before else value  # reset: engine restarted
    return total


# ---------------------------------------------------------------- Prometheus ----------------


class PrometheusClient:
    """PromQL over Prometheus' HTTP API at ``url``: instant (``query``) and range (``query_range``)
    queries; every failure raises ``MetricsUnavailable`` (reason PrometheusUnreachable, its
    message starting with the URL, or PrometheusError). The autoscaler's ``PrometheusSource`` and ``kimik3 usage`` ask through it."""

    def __init__(self, url: str, session: requests.Session | None = None):
        self.url = url.rstrip("/")
        self.session = session or requests.Session()

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """The result vector of ``promql`` evaluated at ``at`` (unix seconds): ``[{"metric":
        {labels}, "value": [t, "<float>"]}, ...]``."""
        return self._get("query", {"query": promql, "time": f"{at:.3f}"})

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """The result matrix of ``promql`` evaluated at ``start``, ``start + step_s``, ... up to
        ``end`` (unix seconds; ``/api/v1/query_range``): ``[{"metric": {labels}, "values": [[t,
        "<float>"], ...]}, ...]``, a series' absent steps left out."""
        return self._get("query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                         "step": f"{step_s:g}"})

    def _get(self, endpoint: str, params: dict[str, str]) -> list[dict[str, Any]]:
        try:
            with self.session.get(f"{self.url}/api/v1/{endpoint}", params=params,
                                  timeout=HTTP_TIMEOUT_S, stream=True) as response:
                body = response.raw.read(MAX_RESPONSE_BYTES + 1, decode_content=True)  # never more in memory
        except requests.Timeout:
            raise MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE,
                                     f"{self.url}: no answer within {HTTP_TIMEOUT_S:g} s") from None
        except requests.ConnectionError:
            raise MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE,
                                     f"{self.url}: cannot connect (nothing listens there, or the host is unknown)") from None
        except (requests.RequestException, OSError) as exc:
            raise MetricsUnavailable(Reason.PROMETHEUS_UNREACHABLE, f"{self.url}: {type(exc).__name__}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            payload = json.loads(body)
        except ValueError:
            raise MetricsUnavailable(Reason.PROMETHEUS_ERROR,
                                     f"HTTP {response.status_code}, not JSON: {body[:200]!r}") from None
        if response.status_code != 200 or not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error") if isinstance(payload, dict) else None
            raise MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"HTTP {response.status_code}: {error or 'bad answer'}")
        result = (payload.get("data") or {}).get("result")
        if not isinstance(result, list):
            raise MetricsUnavailable(Reason.PROMETHEUS_ERROR, "answer without a result")
        return result

    @staticmethod
    def value(sample: dict[str, Any]) -> float:
        """The float of one sample of a ``query`` answer."""
        try:
            return float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"malformed sample {str(sample)[:200]}") from None


class PrometheusSource(PrometheusClient):
    """PromQL over HTTP. Buckets are fetched per ``le`` and the quantile computed here, so the
    per-token conversion and the F8 fallback use the same code as the pod-scrape path."""

    def __init__(self, url: str, session: requests.Session | None = None,
                 clock: Callable[[], float] = time.time, match: dict[str, str] | None = None):
        super().__init__(url, session)
        self.match = dict(match or {})
        """More series labels to select on, e.g. ``{"revision": ...}``: one revision's groups."""
        self.clock = clock

    def _scalar(self, promql: str, at: float) -> float:
        return sum(self.value(s) for s in self.query(promql, at))

    def _histogram(self, name: str, selector: str, window: str, at: float) -> Histogram:
        rows = self.query(f"sum by (le) (increase({name}_bucket{{{selector}}}[{window}]))", at)
        buckets = {}
        for row in rows:
            le = (row.get("metric") or {}).get("le")
            if le is None:
                continue
            buckets[INF if le == "+Inf" else float(le)] = self.value(row)
        total = self._scalar(f"sum(increase({name}_sum{{{selector}}}[{window}]))", at) if buckets else 0.0
        return Histogram(buckets, total)

    def _same_layout(self, name: str, selector: str, at: float) -> None:
        """Raise ``MetricsUnavailable`` when the groups expose different bucket bounds of
        ``name``: ``sum by (le)`` would add unlike buckets (failure case F21b)."""
        layouts: dict[str, set[str]] = {}
        for row in self.query(f"group by (group, le) ({name}_bucket{{{selector}}})", at):
            labels = row.get("metric") or {}
            layouts.setdefault(labels.get("group", ""), set()).add(labels.get("le", ""))
        _merged(name, [(f"group {g}", Histogram({INF if le == "+Inf" else float(le): 0.0 for le in les if le}))
                       for g, les in sorted(layouts.items())])

    def observe(self, namespace: str, deployment: str, window_s: float) -> DecodeObservation:
        at = self.clock()
        sel = ",".join(f'{k}="{v}"' for k, v in {"namespace": namespace, "deployment": deployment,
                                                  **self.match}.items())
        window = f"{max(1, int(window_s))}s"
        groups = self._groups(f"count by (group) ({RUNNING}{{{sel}}})", at)
        if not groups:
            raise MetricsUnavailable(Reason.NO_SERIES,
                                     f"Prometheus has no {RUNNING} series for {namespace}/{deployment}")
        itl_metric, itl = ITL, self._histogram(ITL, sel, window, at)
        if not itl.buckets:
            itl_metric, itl = ITL_OLD, self._histogram(ITL_OLD, sel, window, at)
            if not itl.buckets:
                raise MetricsUnavailable(Reason.NO_LATENCY_METRIC,
                                         f"no {ITL} or {ITL_OLD} series for {namespace}/{deployment}")
        self._same_layout(itl_metric, sel, at)
        kv = [self.value(s) for s in self.query(f"max({KV_USAGE}{{{sel}}})", at)]
        counter = f"{GENERATION_TOKENS}_total{{{sel}}}"
        covered = (self._groups(f"count by (group) ({counter})", at - window_s)
                   & self._groups(f"count by (group) ({counter})", at)) \
            - self._groups(f"count by (group) (resets({counter}[{window}]) > 0)", at)
        return DecodeObservation(
            at=at, window_s=window_s, itl=itl, itl_metric=itl_metric,
            ttft=self._histogram(TTFT, sel, window, at),
            running=self._scalar(f"sum({RUNNING}{{{sel}}})", at),
            waiting=self._scalar(f"sum({WAITING}{{{sel}}})", at),
            kv_usage=kv[0] if kv else None,
            drafts=self._scalar(f"sum(increase({DRAFTS}_total{{{sel}}}[{window}]))", at),
            accepted=self._scalar(f"sum(increase({ACCEPTED}_total{{{sel}}}[{window}]))", at),
            generation_tokens=self._scalar(f"sum(increase({GENERATION_TOKENS}_total{{{sel}}}[{window}]))", at),
            prompt_tokens=self._scalar(f"sum(increase({PROMPT_TOKENS}_total{{{sel}}}[{window}]))", at),
            prefix_cache_hits=self._scalar(f"sum(increase({PREFIX_CACHE_HITS}_total{{{sel}}}[{window}]))", at),
            requests_finished=self._scalar(f"sum(increase({REQUEST_SUCCESS}_total{{{sel}}}[{window}]))", at),
            requests_failed=self._scalar(
                f'sum(increase({REQUEST_SUCCESS}_total{{{sel},finished_reason="{FAILED_REASON}"}}[{window}]))', at),
            groups=frozenset(groups), covered=frozenset(covered & groups))

    def _groups(self, promql: str, at: float) -> set[str]:
        """The ``group`` labels of the series ``promql`` answers at ``at`` (unix seconds)."""
        return {g for r in self.query(promql, at) if (g := (r.get("metric") or {}).get("group", ""))}
