"""Metric sources and quantiles: F8 (metric names), F9 (data-parallel series), the per-token
conversion under speculative decoding, and robustness to bad answers."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimik3.autoscaler.histogram import INF, Histogram, merge, quantile
from kimik3.autoscaler.observation import ITL, DecodeObservation, MetricsUnavailable
from kimik3.autoscaler.sources import PodScrapeSource, PrometheusSource, ScrapeTarget, parse_scrape
from kimik3_dev.devcluster import prometheus
from kimik3_dev.devcluster.processes import free_port
from support.metrics_server import MetricsServer
from support.waiting import wait_for

ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]


def exposition(name: str, per_engine: dict[int, list[float]], model: str = "kimi-k3",
               running: float = 4, drafts: float = 0, accepted: float = 0, tokens: float = 0,
               buckets: list[float] = ITL_BUCKETS) -> str:
    """vLLM-style text: one histogram series per DP engine, from raw observations (seconds)."""
    lines = [f"# HELP {name} Histogram of inter-token latency in seconds.", f"# TYPE {name} histogram"]
    for engine, obs in per_engine.items():
        labels = f'engine="{engine}",model_name="{model}"'
        for le in buckets:
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {sum(1 for o in obs if o <= le)}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {len(obs)}')
        lines.append(f"{name}_count{{{labels}}} {len(obs)}")
        lines.append(f"{name}_sum{{{labels}}} {sum(obs)}")
    lines += ["# TYPE vllm:num_requests_running gauge",
              f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}',
              "# TYPE vllm:num_requests_waiting gauge",
              f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 0',
              "# TYPE vllm:spec_decode_num_drafts counter",
              f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{model}"}} {drafts}',
              "# TYPE vllm:spec_decode_num_accepted_tokens counter",
              f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{model}"}} {accepted}',
              "# TYPE vllm:generation_tokens counter",
              f'vllm:generation_tokens_total{{engine="0",model_name="{model}"}} {tokens}']
    return "\n".join(lines) + "\n"


def test_quantile_interpolates_like_histogram_quantile():
    h = Histogram({0.01: 50, 0.025: 90, 0.05: 100, INF: 100})
    assert quantile(0.5, h) == pytest.approx(0.01)
    assert quantile(0.9, h) == pytest.approx(0.025)
    assert quantile(0.7, h) == pytest.approx(0.01 + 0.015 * (70 - 50) / 40)
    assert quantile(0.99, Histogram({0.1: 1, INF: 100})) == 0.1  # rank in +Inf: largest finite bound
    assert quantile(0.9, Histogram({0.1: 0, INF: 0})) is None


def test_delta_handles_counter_reset():
    old = Histogram({0.1: 10, INF: 12}, 1.0)
    assert (Histogram({0.1: 15, INF: 20}, 2.0) - old).buckets == {0.1: 5, INF: 8}
    restarted = Histogram({0.1: 3, INF: 3}, 0.2)
    assert (restarted - old).buckets == {0.1: 3, INF: 3}


def test_buckets_are_summed_over_engines_before_the_quantile():
    """F9: engines 0..7 of a group, only engine 3 slow: the quantile of the summed buckets, not
    the slowest engine's and not a mean of quantiles."""
    fast = [0.008] * 100
    slow = [0.4] * 100
    engines = {e: (slow if e == 3 else fast) for e in range(8)}
    scrape = parse_scrape(exposition("vllm:inter_token_latency_seconds", engines))
    series = scrape.histograms_named("vllm:inter_token_latency_seconds")
    assert len(series) == 8
    total = merge((f"engine {e}", h) for e, h in enumerate(series))
    assert total.count == 800
    assert quantile(0.5, total) <= 0.01          # the typical step is fast
    # 1 step in 8 is slow: rank 720 of 800 falls 20/100 into the slow bucket (0.3, 0.4].
    assert quantile(0.9, total) == pytest.approx(0.32)
    assert quantile(0.9, merge((f"engine {e}", h) for e, h in enumerate(series[:3]))) <= 0.01  # without the slow one
    assert quantile(0.8, total) <= 0.01


@pytest.fixture
def leader() -> Iterator[MetricsServer]:
    s = MetricsServer()
    yield s
    s.close()


def scrape_source(leader: MetricsServer, clock: list[float]) -> PodScrapeSource:
    return PodScrapeSource(lambda ns, name: [ScrapeTarget("uid-1", "0", leader.url)], clock=lambda: clock[0])


@pytest.mark.parametrize("names", [["vllm:inter_token_latency_seconds"], ["vllm:time_per_output_token_seconds"],
                                   ["vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"]])
def test_itl_name_fallback_never_double_counts(leader, names):
    """F8: only ITL, only the old name, or both: the right series, counted once."""
    clock = [1000.0]
    src = scrape_source(leader, clock)
    leader.text = "".join(exposition(n, {0: [0.01] * 10}) for n in names[:1]) + "".join(
        exposition(n, {0: [0.01] * 10}).split("# TYPE vllm:num_requests_running")[0] for n in names[1:])
    with pytest.raises(MetricsUnavailable) as first:
        src.observe("ns", "k3", 60)
    assert first.value.reason == "WarmingUp"
    clock[0] += 30
    leader.text = "".join(exposition(n, {0: [0.01] * 10 + [0.3] * 30}) for n in names[:1]) + "".join(
        exposition(n, {0: [0.01] * 10 + [0.3] * 30}).split("# TYPE vllm:num_requests_running")[0] for n in names[1:])
    obs = src.observe("ns", "k3", 60)
    assert obs.itl_metric == names[0]
    assert obs.itl.count == 30                      # 30 new steps, not 60
    assert obs.window_s == pytest.approx(30)


def test_neither_latency_metric_means_unavailable(leader):
    clock = [0.0]
    src = scrape_source(leader, clock)
    leader.text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\n"
    with pytest.raises(MetricsUnavailable):
        src.observe("ns", "k3", 60)
    clock[0] += 30
    with pytest.raises(MetricsUnavailable) as err:
        src.observe("ns", "k3", 60)
    assert err.value.reason == "NoLatencyMetric"


def test_per_token_latency_under_dspark_divides_step_time_by_acceptance_length(leader):
    """A DSpark step emits 1 + accepted/drafts tokens: a 12 ms step at acceptance length 4.0 is
    3 ms per token (333 tok/s per user), not 12 ms."""
    clock = [0.0]
    src = scrape_source(leader, clock)
    leader.text = exposition("vllm:inter_token_latency_seconds", {0: []}, drafts=0, accepted=0)
    with pytest.raises(MetricsUnavailable):
        src.observe("ns", "k3", 60)
    clock[0] += 60
    leader.text = exposition("vllm:inter_token_latency_seconds", {0: [0.012] * 100}, drafts=100, accepted=300,
                             tokens=400)
    obs = src.observe("ns", "k3", 60)
    assert obs.acceptance_length == pytest.approx(4.0)
    step = obs.step_latency_quantile(0.9)
    assert 0.01 < step <= 0.025
    assert obs.token_latency_quantile(0.9) == pytest.approx(step / 4.0)
    assert obs.generation_tokens == 400


def test_without_speculation_token_latency_is_itl():
    obs = DecodeObservation(at=0, window_s=60, itl=Histogram({0.01: 90, 0.025: 100, INF: 100}),
                            itl_metric="vllm:inter_token_latency_seconds")
    assert obs.acceptance_length == 1.0
    assert obs.token_latency_quantile(0.9) == obs.step_latency_quantile(0.9)


@pytest.mark.parametrize("text,status", [("not a metric line {{{", 200), ("", 500), ("x" * 10, 503)])
def test_bad_metrics_pages_do_not_crash(leader, text, status):
    clock = [0.0]
    src = scrape_source(leader, clock)
    leader.text, leader.status = text, status
    for _ in range(2):
        with pytest.raises(MetricsUnavailable) as err:
            src.observe("ns", "k3", 60)
        clock[0] += 30
    assert err.value.reason in ("ScrapeFailed", "WarmingUp")


@pytest.mark.parametrize("body,status", [("garbage", 200), ('{"status":"error","error":"boom"}', 500),
                                         ('{"status":"success","data":{}}', 200), ("[1,2]", 200)])
def test_prometheus_errors_and_garbage_are_unavailable_not_crashes(leader, body, status):
    leader.text, leader.status = body, status
    src = PrometheusSource(leader.url.rsplit("/", 1)[0])
    with pytest.raises(MetricsUnavailable) as err:
        src.observe("ns", "k3", 120)
    assert err.value.reason in ("PrometheusError", "NoSeries")


def test_prometheus_unreachable_is_unavailable():
    src = PrometheusSource("http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(MetricsUnavailable) as err:
        src.observe("ns", "k3", 120)
    assert err.value.reason == "PrometheusUnreachable"


def test_huge_metrics_page_is_refused_not_loaded(leader):
    from kimik3.autoscaler.sources import MAX_RESPONSE_BYTES
    clock = [0.0]
    src = scrape_source(leader, clock)
    leader.text = "#" * (MAX_RESPONSE_BYTES + 100)
    with pytest.raises(MetricsUnavailable) as err:
        src.observe("ns", "k3", 60)
    assert err.value.reason == "ScrapeFailed"
    assert f"/metrics larger than {MAX_RESPONSE_BYTES} bytes" in str(err.value)


def test_huge_prometheus_answer_is_refused_not_loaded(leader):
    from kimik3.autoscaler.sources import MAX_RESPONSE_BYTES
    leader.text = '{"status":"success","data":{"result":[' + " " * (MAX_RESPONSE_BYTES + 100) + "]}}"
    src = PrometheusSource(leader.url.rsplit("/", 1)[0])
    with pytest.raises(MetricsUnavailable) as err:
        src.observe("ns", "k3", 120)
    assert (err.value.reason, str(err.value).endswith(f"answer larger than {MAX_RESPONSE_BYTES} bytes")) == (
        "PrometheusError", True)


REAL_PAGE = exposition("vllm:inter_token_latency_seconds", {0: [0.004] * 50, 1: [0.02] * 5}, drafts=10,
                       accepted=25, tokens=400)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mangled_metrics_pages_never_crash_the_scrape_source(leader, data):
    """Random cuts, insertions and byte swaps of a vLLM page: an observation or MetricsUnavailable,
    nothing else escapes (the controller turns MetricsUnavailable into MetricsAvailable=False)."""
    text = REAL_PAGE
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        edit = data.draw(st.sampled_from(["cut", "insert", "swap"]))
        if edit == "cut":
            text = text[:at] + text[at + data.draw(st.integers(1, 200)):]
        elif edit == "insert":
            text = text[:at] + data.draw(st.text(max_size=40)) + text[at:]
        else:
            text = text[:at] + data.draw(st.sampled_from(['"', "{", "}", "\n", " ", "NaN", "-1", "1e309", "\x00",
                                                          "le=", ","])) + text[at + 1:]
    clock = [0.0]
    src = scrape_source(leader, clock)
    leader.text = REAL_PAGE
    try:
        src.observe("ns", "k3", 60)  # first scrape: no window yet
    except MetricsUnavailable:
        pass
    clock[0] += 30
    leader.text = text
    try:
        obs = src.observe("ns", "k3", 60)
    except MetricsUnavailable as exc:
        assert exc.reason in ("ScrapeFailed", "WarmingUp", "NoLatencyMetric", "BucketLayoutsDiffer"), exc.reason
    else:
        assert isinstance(obs, DecodeObservation)


def test_pod_scrape_windows_start_at_the_scrape_a_window_old(leader):
    """Scrapes every 30 s, a 60 s window: each observation differences against the scrape 60 s
    back (as Prometheus' increase over the window), not the previous one; the window is 60 s once
    the pod has been scraped that long, and what it has until then."""
    clock = [0.0]
    src = scrape_source(leader, clock)
    counts = {0.0: 10, 30.0: 20, 60.0: 30, 90.0: 45}
    seen = {}
    for at, count in counts.items():
        clock[0] = at
        leader.text = exposition("vllm:inter_token_latency_seconds", {0: [0.01] * count}, tokens=4 * count)
        try:
            seen[at] = src.observe("ns", "k3", 60)
        except MetricsUnavailable as exc:
            assert (at, exc.reason) == (0.0, "WarmingUp")
    assert [(o.window_s, o.itl.count, o.generation_tokens) for o in seen.values()] == [
        (30, 10, 40), (60, 20, 80), (60, 25, 100)]


def test_a_leader_scraped_the_first_time_adds_its_gauges_not_its_counters():
    """Gauges need no window: a group whose first scrape this is counts its running requests;
    its counters and histograms wait for a window."""
    pages = {"a": exposition("vllm:inter_token_latency_seconds", {0: [0.01] * 10}, running=3, tokens=10)}
    targets = [ScrapeTarget("uid-a", "0", "a")]
    clock = [0.0]
    src = PodScrapeSource(lambda ns, name: list(targets), fetch=lambda url: pages[url], clock=lambda: clock[0])
    with pytest.raises(MetricsUnavailable):
        src.observe("ns", "k3", 60)
    clock[0] = 30.0
    pages["a"] = exposition("vllm:inter_token_latency_seconds", {0: [0.01] * 40}, running=3, tokens=40)
    pages["b"] = exposition("vllm:inter_token_latency_seconds", {0: [0.01] * 500}, running=5, tokens=500)
    targets.append(ScrapeTarget("uid-b", "1", "b"))
    obs = src.observe("ns", "k3", 60)
    assert (obs.running, obs.itl.count, obs.generation_tokens, obs.groups) == (8, 30, 30, frozenset({"0", "1"}))


def test_a_leader_that_refused_counts_from_zero_and_a_removed_one_until_its_last_page():
    """A group loading refuses the connection (vLLM listens once loaded): its first page is
    differenced against zero counters at the refused scrape, so the tokens it served before its
    second scrape count. A group scaled down still counts what it served inside the window, up
    to its last page; once that page is older than the window it is forgotten."""
    def page(steps: int, running: float) -> str:
        return exposition("vllm:inter_token_latency_seconds", {0: [0.01] * steps}, running=running, tokens=4 * steps)

    pages: dict[str, str | None] = {"a": page(100, 3), "b": None}
    targets = {"a": ScrapeTarget("uid-a", "0", "a"), "b": ScrapeTarget("uid-b", "1", "b")}
    clock = [0.0]

    def fetch(url: str) -> str:
        text = pages[url]
        if text is None:
            raise requests.ConnectionError(ConnectionRefusedError(111, "Connection refused"))
        return text

    src = PodScrapeSource(lambda ns, name: list(targets.values()), fetch=fetch, clock=lambda: clock[0])
    with pytest.raises(MetricsUnavailable):
        src.observe("ns", "k3", 60)  # a: first page; b: refused (loading)
    clock[0], pages["a"], pages["b"] = 30.0, page(130, 3), page(20, 2)  # b became ready and served 20 steps
    obs = src.observe("ns", "k3", 60)
    assert (obs.itl.count, obs.running, obs.groups) == (30 + 20, 5, frozenset({"0", "1"}))
    clock[0], pages["a"], pages["b"] = 60.0, page(160, 3), page(50, 2)
    assert src.observe("ns", "k3", 60).itl.count == 60 + 50  # b from zero at 0 s
    del targets["b"]  # b scaled down after its page at 60 s
    clock[0], pages["a"] = 90.0, page(190, 3)
    obs = src.observe("ns", "k3", 60)
    # a: 190 - 130 (its page at 30 s starts the window); b: 50 - 20 up to its last page (60 s)
    assert (obs.itl.count, obs.running, obs.groups) == (60 + 30, 3, frozenset({"0"}))
    clock[0], pages["a"] = 150.0, page(250, 3)
    assert src.observe("ns", "k3", 60).itl.count == 250 - 190  # b's last page is out of the window


def test_a_group_covers_the_window_only_with_its_counters_from_start_to_end():
    """Issue 23 item 5, the pod-scrape source (window 60 s, a scrape every 30 s): a pod covers the
    window once its scrape that starts it is at least 60 s old (less the 5% slack); a counter that
    went down inside the window (engine restarted) uncovers it until the window has passed; a pod
    that refused since before the window's start (loading: nothing served) covers from its first
    page, differenced against zero at the window's start; one that refused inside the window (a
    restart) does not."""
    tokens = {"a": 0.0, "b": 0.0, "c": None, "d": 0.0}
    pages = lambda url: exposition(ITL, {0: [0.01] * 10}, tokens=tokens[url])  # noqa: E731
    clock = [0.0]

    def fetch(url: str) -> str:
        if tokens[url] is None:
            raise requests.ConnectionError(ConnectionRefusedError(111, "Connection refused"))
        return pages(url)

    targets = [ScrapeTarget(f"uid-{k}", str(i), k) for i, k in enumerate("abcd")]
    src = PodScrapeSource(lambda ns, name: targets, fetch=fetch, clock=lambda: clock[0])
    seen = {}
    for at, changes in [(0, {}), (30, {"a": 3000, "b": 3000, "d": 3000}), (60, {"a": 6000, "b": 6000, "d": None}),
                        (90, {"a": 9000, "b": 500, "c": 2000, "d": 100}), (120, {"a": 12000, "b": 3500, "c": 5000,
                                                                                  "d": 3100}),
                        (150, {"a": 15000, "b": 6500, "c": 8000, "d": 6100})]:
        clock[0] = float(at)
        tokens.update(changes)
        try:
            o = src.observe("ns", "k3", 60)
            seen[at] = (sorted(o.groups), sorted(o.covered), o.generation_tokens)
        except MetricsUnavailable as exc:
            seen[at] = exc.reason
    assert seen == {
        0: "ScrapeFailed",                                    # c refuses (loading) from 0 s
        30: (["0", "1", "3"], ["0", "1", "3"], 9000.0),       # every pod's window 30 s: a whole 30 s reading
        60: (["0", "1"], ["0", "1"], 12000.0),                # d restarts: refused
        90: (["0", "1", "2", "3"], ["0", "2"], 6000 + 500 + 2000 + 100),  # b's counter went down; c from zero
        # The reset is still in b's window; d's refusal (60 s) is before the window's start (63 s).
        120: (["0", "1", "2", "3"], ["0", "2", "3"], 6000 + 3500 + 5000 + 3100),
        150: (["0", "1", "2", "3"], ["0", "1", "2", "3"], 6000 + 6000 + 6000 + 6000)}


def test_a_group_back_after_a_gap_counts_at_its_rate_and_does_not_cover_the_window():
    """Group 1's scrapes fail (HTTP 503) for 90 s while its engine serves 100 tokens/s like group
    0's. Back, its page starting the window is 120 s old: counted whole over the 60 s window, its
    tokens would read twice its rate; they count at its rate (60 x 100), and it does not cover
    the window until a whole window of its pages has passed."""
    clock = [0.0]
    status = {"a": 200, "b": 200}

    def fetch(url: str) -> str:
        if status[url] != 200:
            raise requests.HTTPError(f"{status[url]} Service Unavailable")
        return exposition(ITL, {0: [0.01] * int(clock[0])}, tokens=100 * clock[0])

    src = PodScrapeSource(lambda ns, name: [ScrapeTarget("uid-a", "0", "a"), ScrapeTarget("uid-b", "1", "b")],
                          fetch=fetch, clock=lambda: clock[0])
    seen = {}
    for at in range(0, 300, 30):
        clock[0] = float(at)
        status["b"] = 503 if 30 < at < 150 else 200
        try:
            o = src.observe("ns", "k3", 60)
            seen[at] = (o.window_s, o.generation_tokens, sorted(o.covered))
        except MetricsUnavailable:
            pass
    assert seen[120] == (60, 6000, ["0"])                 # b unmeasured
    assert seen[150] == (60, 12000, ["0"])                # b back: 12,000 tokens since 30 s, at its rate
    assert seen[180] == (60, 12000, ["0"])                # b's window still starts before its gap ended
    assert seen[210] == (60, 12000, ["0", "1"])


def test_only_a_refused_connection_means_nothing_listens():
    from kimik3.autoscaler.sources import _refused
    with pytest.raises(requests.ConnectionError) as refused:
        requests.get("http://127.0.0.1:9/metrics", timeout=2)  # discard port: nothing listens
    assert _refused(refused.value)
    assert not _refused(requests.ConnectTimeout("slow"))
    assert not _refused(requests.HTTPError("503 Service Unavailable"))


COARSE_BUCKETS = [0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 80.0]
"""Another engine image's ITL buckets (mid-rollout, the new revision's; failure case F21b)."""


def test_unlike_bucket_layouts_are_not_summed_by_the_pod_scrape_source():
    """F21b: group 0 (old image) and group 1 (new image) expose different ITL bucket bounds.
    Summing them would put group 1's 20 ms steps at or under 25 ms and its 40 ms ones at or
    under 50 ms, both into the wrong buckets: the reading is refused and names both groups."""
    pages = {"a": exposition(ITL, {0: [0.02] * 10}, tokens=10), "b": exposition(ITL, {0: [0.04] * 10}, tokens=10,
                                                                                  buckets=COARSE_BUCKETS)}
    clock = [0.0]
    src = PodScrapeSource(lambda ns, name: [ScrapeTarget("uid-a", "0", "a"), ScrapeTarget("uid-b", "1", "b")],
                          fetch=lambda url: pages[url], clock=lambda: clock[0])
    with pytest.raises(MetricsUnavailable):
        src.observe("ns", "k3", 60)  # first scrape: no window
    clock[0] = 30.0
    pages["a"] = exposition(ITL, {0: [0.02] * 20}, tokens=20)
    pages["b"] = exposition(ITL, {0: [0.04] * 20}, tokens=20, buckets=COARSE_BUCKETS)
    with pytest.raises(MetricsUnavailable) as refused:
        src.observe("ns", "k3", 60)
    assert refused.value.reason == "BucketLayoutsDiffer"
    assert refused.value.message == (
        f"{ITL}: group 0 {{engine='0', model_name='kimi-k3'}} and group 1 {{engine='0', model_name='kimi-k3'}} "
        "expose different bucket bounds (only one of them has le=0.01, 0.02, 0.025, 0.075, 0.15, 0.2)")


def scraping(tmp_path, leaders: list[MetricsServer]) -> tuple[subprocess.Popen, PrometheusSource]:
    """A real Prometheus scraping ``leaders`` (static targets with the PodMonitor's labels:
    namespace ns, deployment k3, group = the index), and a source reading it."""
    config = prometheus.write_config(tmp_path, [
        (s.url.split("/")[2], {"namespace": "ns", "deployment": "k3", "group": str(g), "role": "leader"})
        for g, s in enumerate(leaders)])
    port = free_port()
    proc = subprocess.Popen(prometheus.argv(prometheus.ensure_installed(), config, tmp_path, port),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, PrometheusSource(f"http://127.0.0.1:{port}")


@pytest.mark.tier("process")  # a real Prometheus
def test_unlike_bucket_layouts_are_refused_through_real_prometheus(tmp_path):
    """F21b through Prometheus 2.42 scraping two stand-in leaders (static targets with the
    PodMonitor's labels): one layout reads, two layouts raise BucketLayoutsDiffer."""
    leaders = [MetricsServer(), MetricsServer()]
    for s in leaders:
        s.text = exposition(ITL, {0: [0.02] * 10}, tokens=10)
    proc, src = scraping(tmp_path, leaders)

    def reading() -> DecodeObservation | str | None:
        try:
            return src.observe("ns", "k3", 60)
        except MetricsUnavailable as exc:
            return exc.reason if exc.reason == "BucketLayoutsDiffer" else None
    try:
        obs = wait_for(reading, 60, "Prometheus to hold two scrapes of both stand-in leaders")
        assert isinstance(obs, DecodeObservation) and obs.groups == frozenset({"0", "1"})
        leaders[1].text = exposition(ITL, {0: [0.04] * 20}, tokens=20, buckets=COARSE_BUCKETS)

        assert wait_for(lambda: isinstance(r := reading(), str) and r, 30,
                        "the new layout to be scraped") == "BucketLayoutsDiffer"
    finally:
        proc.terminate()
        proc.wait(10)
        for s in leaders:
            s.close()


@pytest.mark.tier("process")  # a real Prometheus
def test_prometheus_covers_a_group_only_with_its_counter_through_the_window(tmp_path):
    """Issue 23 item 5 through Prometheus 2.42 (5 s scrapes) over a 20 s window: two stand-in
    leaders whose counters grow in real time. Group 1's scrapes fail (HTTP 503: Prometheus marks
    its series stale) for 25 s: once back, its counter has no sample at the window's start and
    it is not covered until a window has passed; then its engine restarts (counter back to zero):
    ``resets()`` uncovers it for a window. Group 0 stays covered throughout."""
    leaders = [MetricsServer(), MetricsServer()]
    started = time.time()
    zero = [started, started]

    def pages() -> None:
        while not stop.is_set():
            for g, s in enumerate(leaders):
                s.text = exposition(ITL, {0: [0.01] * 10}, tokens=round(1000 * (time.time() - zero[g])))
            stop.wait(0.5)

    stop = threading.Event()
    threading.Thread(target=pages, daemon=True).start()
    proc, src = scraping(tmp_path, leaders)

    def covered() -> frozenset[str] | None:
        try:
            return src.observe("ns", "k3", 20).covered
        except MetricsUnavailable:
            return None
    try:
        assert wait_for(lambda: covered() == {"0", "1"}, 60, "both groups covering a 20 s window")
        leaders[1].status = 503
        assert wait_for(lambda: covered() == {"0"}, 20, "group 1 stale")
        time.sleep(25)
        leaders[1].status = 200
        back = time.time()
        assert wait_for(lambda: covered() == {"0", "1"}, 40, "group 1 covering again")
        assert time.time() - back >= 20 - 5  # not before a window of its samples (less a scrape)
        zero[1] = time.time()  # group 1's engine restarts
        assert wait_for(lambda: covered() == {"0"}, 20, "the reset seen")
        assert wait_for(lambda: covered() == {"0", "1"}, 40, "the reset out of the window")
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
        for s in leaders:
            s.close()
