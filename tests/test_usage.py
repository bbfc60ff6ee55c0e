"""Usage per tenant (issue 28 items 1-2): the operator's GPU series, the recording rules' text,
and the report's arithmetic on given query answers (``kimik3.usage``). The rules evaluated by a
real Prometheus: tests/test_usage_prometheus.py."""

from __future__ import annotations

import csv
import datetime as dt
import http.server
import io
import json
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kimik3.cli import RULES_FILE, main
from kimik3.controller.metrics import GpuTime
from kimik3.kube.groups import BURST, HELD, RESERVED, SERVING, gpus_by_revision, groups_of
from kimik3.kube.labels import GPU_RESOURCE, LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_REVISION_LABEL, \
    LWS_WORKER_INDEX_LABEL
from kimik3.usage import report
from kimik3.usage.rules import RULES, SLO_MEASURED, SLO_WITHIN, rule_groups, slo_record

REPO = Path(__file__).resolve().parents[1]
H0 = dt.datetime(2026, 12, 4, 10, tzinfo=dt.timezone.utc).timestamp()
"""Start of an hour (10:00 UTC)."""


# ---------------------------------------------------------------- GPUs held and serving ------


def pod(group: int, worker: int, revision: str, gpus: int = 4, node: str = "tray", ready: bool = True,
        phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"k3-{group}-{worker}", "labels": {
                LWS_NAME_LABEL: "k3", LWS_GROUP_INDEX_LABEL: str(group), LWS_WORKER_INDEX_LABEL: str(worker),
                LWS_REVISION_LABEL: revision}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_gpus_held_count_every_bound_pod_and_serving_only_those_of_ready_groups():
    pods = [pod(0, 0, "a"), pod(0, 1, "a"),                      # group 0: Ready, 8 GPUs of revision a
            pod(1, 0, "b"), pod(1, 1, "b", ready=False),         # group 1: loading, 8 GPUs of b held
            pod(2, 0, "b", node="", ready=False), pod(2, 1, "b", node="", ready=False),  # group 2: waiting for trays: none held
            pod(3, 0, "b", ready=False, phase="Failed"), pod(3, 1, "b")]  # group 3: a finished pod frees its GPUs
    def reserved(index: int) -> str:
        return RESERVED
    assert gpus_by_revision(groups_of(pods, 2).values(), reserved) == {
        ("a", HELD, RESERVED): 8, ("a", SERVING, RESERVED): 8, ("b", HELD, RESERVED): 12, ("b", SERVING, RESERVED): 0}
    # a revision whose pods wait for trays is there at 0: its counter starts from a scraped zero
    assert gpus_by_revision(groups_of(pods[4:6], 2).values(), reserved) == {("b", HELD, RESERVED): 0,
                                                                            ("b", SERVING, RESERVED): 0}
    # groups 2 and 3 burst (above minReplicas 2): their GPUs are told apart
    assert gpus_by_revision(groups_of(pods, 2).values(), lambda i: RESERVED if i < 2 else BURST) == {
        ("a", HELD, RESERVED): 8, ("a", SERVING, RESERVED): 8, ("b", HELD, RESERVED): 8, ("b", SERVING, RESERVED): 0,
        ("b", HELD, BURST): 4, ("b", SERVING, BURST): 0}


def exported(collector: GpuTime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


def labels(revision: str, state: str, capacity: str = RESERVED) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": "t", "deployment": "k3", "revision": revision, "state": state,
                         "capacity": capacity}.items()))


def test_gpu_seconds_integrate_the_gpus_held_between_changes_and_scrapes():
    now = [0.0]
    gpu = GpuTime(clock=lambda: now[0])
    gpu.set("t", "k3", {("a", HELD, RESERVED): 8})
    now[0] = 100.0
    gpu.set("t", "k3", {("a", HELD, RESERVED): 8, ("a", SERVING, RESERVED): 8, ("b", HELD, RESERVED): 16})
    now[0] = 250.0
    out = exported(gpu)
    assert out[("kimik3_gpu_seconds_total", labels("a", HELD))] == 8 * 250
    assert out[("kimik3_gpu_seconds_total", labels("a", SERVING))] == 8 * 150
    assert out[("kimik3_gpu_seconds_total", labels("b", HELD))] == 16 * 150
    assert out[("kimik3_gpus", labels("b", HELD))] == 16
    gpu.set("t", "k3", {("a", HELD, RESERVED): 8})  # revision b retired at 250 s
    now[0] = 300.0
    out = exported(gpu)
    assert ("kimik3_gpus", labels("b", HELD)) not in out
    assert out[("kimik3_gpu_seconds_total", labels("b", HELD))] == 16 * 150  # its final count, kept
    assert out[("kimik3_gpu_seconds_total", labels("a", HELD))] == 8 * 300
    gpu.clear()  # this replica stops leading: nothing more accrues here
    now[0] = 300.0 + GpuTime.RETAIN_S / 2
    out = exported(gpu)
    assert out[("kimik3_gpu_seconds_total", labels("a", HELD))] == 8 * 300
    assert not [k for k in out if k[0] == "kimik3_gpus"]
    now[0] = 300.0 + GpuTime.RETAIN_S + 1
    assert exported(gpu) == {}


# ---------------------------------------------------------------- the rules ------------------


def test_rules_are_named_level_metric_operations_and_the_chart_ships_them_as_written():
    records = [r["record"] for r in rule_groups()["groups"][0]["rules"]]
    assert records == [
        "namespace_deployment_revision:vllm_prompt_tokens:increase1h",
        "namespace_deployment_revision:vllm_generation_tokens:increase1h",
        "namespace_deployment_revision:vllm_prefix_cache_hits:increase1h",
        "namespace_deployment_revision_finished_reason:vllm_request_success:increase1h",
        "namespace_deployment_revision_state_capacity:kimik3_gpu_seconds:increase1h",
        "namespace_deployment_target:kimik3_latency_within_target:sum_over_time1h",
        "namespace_deployment_target:kimik3_latency_within_target:count_over_time1h"]
    assert RULES["requests"].expr() == \
        "sum by (namespace, deployment, revision, finished_reason) (increase(vllm:request_success_total[1h]))"
    result = CliRunner().invoke(main, ["rules"])
    assert result.exit_code == 0, result.output
    assert (REPO / RULES_FILE).read_text() == result.output, "the chart's rules are stale: run `tools/kimik3 rules " \
                                                              f"-o {RULES_FILE}`"


# ---------------------------------------------------------------- the report's arithmetic ----


def series(name: str, points: dict[float, float], **labels: str) -> tuple[str, dict[str, Any]]:
    """One series of a query_range answer: ``points`` by hour start, each value at the hour's end."""
    return name, {"metric": labels, "values": [[h + 3600, str(v)] for h, v in points.items()]}


def answers(*rows: tuple[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, s in rows:
        out.setdefault(name, []).append(s)
    return out


T = {"namespace": "tenant-a", "deployment": "k3"}


def test_rows_add_revisions_and_turn_gpu_seconds_into_hours_and_minutes_into_attainment():
    h1 = H0 + 3600
    usages = report.rows(answers(
        series(RULES["prompt_tokens"].record(), {H0: 1000, h1: 500}, **T, revision="a"),
        series(RULES["prompt_tokens"].record(), {h1: 250.4}, **T, revision="b"),
        series(RULES["cached_prompt_tokens"].record(), {H0: 600}, **T, revision="a"),
        series(RULES["generation_tokens"].record(), {H0: 3000.6}, **T, revision="a"),
        series(RULES["requests"].record(), {H0: 9}, **T, revision="a", finished_reason="stop"),
        series(RULES["requests"].record(), {H0: 1}, **T, revision="a", finished_reason="error"),
        series(RULES["gpu_seconds"].record(), {H0: 16 * 3600, h1: 16 * 1800}, **T, revision="a", state=HELD,
               capacity=RESERVED),
        series(RULES["gpu_seconds"].record(), {H0: 8 * 3600}, **T, revision="a", state=SERVING, capacity=RESERVED),
        series(RULES["gpu_seconds"].record(), {h1: 16 * 3600}, **T, revision="b", state=HELD, capacity=BURST),
        series(slo_record(SLO_WITHIN), {H0: 45}, **T, target="latency"),
        series(slo_record(SLO_MEASURED), {H0: 60}, **T, target="latency"),
        series(RULES["generation_tokens"].record(), {H0: 7}, namespace="tenant-b", deployment="k3", revision="c"),
    ))
    assert [(u.hour, u.namespace, u.deployment) for u in usages] == [
        (H0, "tenant-a", "k3"), (H0, "tenant-b", "k3"), (h1, "tenant-a", "k3")]
    first, other, second = usages
    assert (first.prompt_tokens, first.cached_prompt_tokens, first.generation_tokens) == (1000, 600, 3000.6)
    assert first.requests == {"stop": 9, "error": 1}
    assert (first.gpu_hours_held, first.gpu_hours_serving, first.serving_share) == (16, 8, 0.5)
    assert (first.latency_minutes_within, first.latency_minutes_measured, first.latency_attainment) == (45, 60, 0.75)
    assert first.ttft_attainment is None and first.ttft_minutes_measured is None  # no TTFT target
    assert second.prompt_tokens == pytest.approx(750.4) and second.revisions == {"a", "b"}
    assert (second.gpu_hours_held, second.gpu_hours_serving, second.serving_share) == (24, 0, 0)
    # held GPU-hours split by capacity: revision b's groups were burst (above minReplicas)
    assert (first.gpu_hours_reserved, first.gpu_hours_burst) == (16, 0)
    assert (second.gpu_hours_reserved, second.gpu_hours_burst) == (8, 16)
    assert (report.record(second)["gpu_hours_reserved"], report.record(second)["gpu_hours_burst"]) == (8, 16)
    assert second.latency_attainment is None  # no reading: not 0 % attained
    rec = report.record(first)
    assert list(rec) == list(report.COLUMNS)
    assert (rec["hour"], rec["generation_tokens"], rec["requests"], rec["requests_stop"], rec["requests_error"],
            rec["latency_attainment"], rec["ttft_attainment"]) == ("2026-12-04T10:00:00Z", 3001, 10, 9, 1, 0.75, None)
    assert report.record(other)["gpu_hours_held"] == 0 and report.record(other)["serving_share"] is None


def test_a_malformed_answer_is_named_not_billed():
    from kimik3.autoscaler.observation import MetricsUnavailable
    with pytest.raises(MetricsUnavailable, match=r"malformed point \[7200, 'many'\]"):
        report.rows({RULES["generation_tokens"].record(): [{"metric": T, "values": [[7200, "many"]]}]})


def test_whole_hours_only():
    assert report.hour_starts(H0 + 1800, H0 + 3 * 3600 + 1) == [H0, H0 + 3600, H0 + 7200]
    assert report.hour_starts(H0, H0 + 3599) == []


# ---------------------------------------------------------------- the command ----------------


class StandIn(http.server.ThreadingHTTPServer):
    """Answers /api/v1/query_range with ``answers`` by the query's metric name; keeps the queries."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]]):
        self.answers, self.asked = answers, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler) -> None:  # noqa: N805
                url = urllib.parse.urlsplit(handler.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                self.asked.append((url.path, query))
                body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": self.answers.get(
                    query["query"].split("{")[0], [])}}).encode()
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_kimik3_usage_asks_each_rule_once_per_range_and_prints_csv_and_json():
    stand_in = StandIn(answers(
        series(RULES["generation_tokens"].record(), {H0: 1200, H0 + 3600: 800}, **T, revision="a"),
        series(RULES["gpu_seconds"].record(), {H0: 8 * 3600}, **T, revision="a", state=HELD)))
    try:
        start, end = "2026-12-04T10:00:00Z", "2026-12-04T12:00:00Z"
        result = CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--start", start, "--end", end,
                                           "--format", "csv", "-n", "tenant-a"])
        assert result.exit_code == 0, result.output
        rows = list(csv.DictReader(io.StringIO(result.output)))
        assert [(r["hour"], r["generation_tokens"], r["gpu_hours_held"], r["latency_attainment"]) for r in rows] == [
            ("2026-12-04T10:00:00Z", "1200", "8.0", ""), ("2026-12-04T11:00:00Z", "800", "0.0", "")]
        assert len(stand_in.asked) == 7
        path, query = stand_in.asked[0]
        assert path == "/api/v1/query_range"
        assert query["query"] == RULES["prompt_tokens"].record() + '{namespace="tenant-a"}'
        assert (float(query["start"]), float(query["end"]), query["step"]) == (H0 + 3600, H0 + 7200, "3600")
        out = json.loads(CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--start", start, "--end",
                                                   end, "--format", "json"]).output)
        assert (out["start"], out["end"], len(out["rows"])) == (start, end, 2)
        table = CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--start", start, "--end", end])
        header, first, _ = table.output.splitlines()
        assert header.split()[:3] == ["hour", "namespace", "deployment"] and "1200" in first.split()
    finally:
        stand_in.shutdown()


def test_kimik3_usage_rolling_reads_the_hours_ending_at_end_unrounded():
    end = H0 + 3600 + 1234  # 11:20:34, not a whole hour
    stand_in = StandIn(answers(series(RULES["generation_tokens"].record(), {end - 3600: 500}, **T, revision="a")))
    try:
        result = CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--rolling", "--hours", "1",
                                           "--end", "2026-12-04T11:20:34Z", "--format", "json"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        assert (out["start"], out["end"]) == ("2026-12-04T10:20:34Z", "2026-12-04T11:20:34Z")
        assert [(r["hour"], r["generation_tokens"]) for r in out["rows"]] == [("2026-12-04T10:20:34Z", 500)]
        _, query = stand_in.asked[0]
        assert (float(query["start"]), float(query["end"]), query["step"]) == (end, end, "3600")
    finally:
        stand_in.shutdown()
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--rolling", "--start",
                                       "2026-12-04T10:00:00Z"])
    assert result.exit_code == 2 and "--rolling counts --hours back from --end: leave --start out" in result.output


def test_an_empty_report_says_so_and_points_at_rolling_hours_and_the_help_names_the_env_var():
    """A new user's first `kimik3 usage` right after traffic reads whole UTC hours only: the table
    is empty, and the CLI says which hours it read and how to read the past 60 minutes."""
    stand_in = StandIn({})
    try:
        result = CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--start", "2026-12-04T10:00:00Z",
                                           "--end", "2026-12-04T12:00:00Z", "-n", "tenant-a"])
        assert result.exit_code == 0, result.output
        assert result.stdout.split() == ["hour", "namespace", "deployment"] + result.stdout.split()[3:]
        assert len(result.stdout.splitlines()) == 1  # the header only
        assert result.stderr == ("no usage recorded for namespace tenant-a from 2026-12-04T10:00:00Z to "
                                 "2026-12-04T12:00:00Z (whole UTC hours only: the hour under way is left out; "
                                 "`--rolling --hours 1` reads the past 60 minutes)\n")
        rolling = CliRunner().invoke(main, ["usage", "--prometheus", stand_in.url, "--rolling", "--hours", "1",
                                            "--end", "2026-12-04T11:20:34Z"])
        assert rolling.stderr == "no usage recorded from 2026-12-04T10:20:34Z to 2026-12-04T11:20:34Z\n"
    finally:
        stand_in.shutdown()
    assert "[env var: KIMIK3_PROMETHEUS_URL" in CliRunner().invoke(main, ["usage", "--help"]).output


def test_kimik3_usage_names_an_unreachable_prometheus_and_a_bad_range():
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--hours", "2"])
    assert result.exit_code == 1 and result.output == ("Error: Prometheus at http://127.0.0.1:9: cannot connect "
                                                       "(nothing listens there, or the host is unknown)\n")
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--start", "2026-12-04",
                                       "--end", "2026-12-03"])
    assert result.exit_code == 2 and "--start must be before --end" in result.output
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--end", "2999-01-01"])
    assert result.exit_code == 2 and "is in the future" in result.output
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--start",
                                       "2026-12-04T10:10", "--end", "2026-12-04T10:50"])
    assert result.exit_code == 2 and "no whole UTC hour between --start and --end" in result.output
    result = CliRunner().invoke(main, ["usage", "--prometheus", "http://127.0.0.1:9", "--start", "yesterday"])
    assert result.exit_code == 2 and "'yesterday' is not an RFC 3339 time" in result.output


# ---------------------------------------------------------------- the reconcile exports them -


@pytest.mark.usefixtures("pods_made")
def test_the_reconcile_exports_each_revisions_gpus_from_its_pods_and_drops_them_when_the_cr_is_gone(
        kube, namespace):
    """On a real kube-apiserver, a Reconciler driven by hand (no LWS controller: the group's pods
    made as LWS v0.9 would, ``support.lws_pods``): the revision is exported at 0 while its pods
    wait for trays, holds every GPU once they are bound, serves them once the group is Ready, and
    its gauges go when the CR is gone."""
    from kimik3.controller import metrics
    from kimik3.controller.reconcile import Reconciler
    from kimik3.kube.kinds import POD
    from support.cluster import CR, LWS, apply
    from support.lws_pods import group_pods
    from support.recipes import recipe

    rec = Reconciler(kube)
    apply(kube, recipe(replicas=1, autoscaling={"enabled": False}), namespace)
    name = recipe()["metadata"]["name"]
    for _ in range(3):  # the finalizer, WeightsReady announced, then the engines
        rec.reconcile(namespace, name)
    (lws,) = kube.list(*LWS, namespace, "")
    pods = group_pods(lws, namespace, 0)
    per_pod = int(pods[0]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE])
    for pod in pods:
        pod["metadata"]["labels"][LWS_REVISION_LABEL] = "r1"
        kube.apply({"apiVersion": "v1", "kind": "Pod", **pod})

    def gauges() -> dict[tuple[str, str], float]:
        rec.reconcile(namespace, name)
        return {(dict(k[1])["revision"], dict(k[1])["state"]): v for k, v in exported(metrics.GPU_TIME).items()
                if k[0] == "kimik3_gpus" and dict(k[1])["namespace"] == namespace
                and dict(k[1])["capacity"] == RESERVED}

    assert gauges() == {("r1", HELD): 0, ("r1", SERVING): 0}
    for n, pod in enumerate(pods):
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": f"tray-{n}"}})
    assert gauges() == {("r1", HELD): per_pod * len(pods), ("r1", SERVING): 0}
    for pod in pods:
        kube.patch_merge(*POD.type_meta, namespace, pod["metadata"]["name"], {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
    assert gauges() == {("r1", HELD): per_pod * len(pods), ("r1", SERVING): per_pod * len(pods)}
    # gone (its finalizer lifted: no garbage collector runs here to take the children first)
    kube.patch_merge(*CR, namespace, name, {"metadata": {"finalizers": None}})
    kube.delete(*CR, namespace, name)
    assert kube.get(*CR, namespace, name) is None
    assert gauges() == {}
