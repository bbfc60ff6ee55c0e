"""The dev Prometheus (Debian's package) scrapes on loopback: the operator's /metrics, and the
engine simulator's engines through the file_sd file it writes (``<state>/sim/targets.json``)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from devenv import DevEnv

from kimik3_dev.devcluster.readiness import http_get
from support.waiting import wait_for


def _targets(env: DevEnv) -> list[dict]:
    status, body = http_get(env.state["urls"]["prometheus"] + "/api/v1/targets?state=active")
    assert status == 200, body
    return json.loads(body)["data"]["activeTargets"]


def test_prometheus_scrapes_the_operator_every_5s(dev_env: DevEnv) -> None:
    status, body = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/status/config")
    config = json.loads(body)["data"]["yaml"]
    assert "scrape_interval: 5s" in config
    assert str(dev_env.cluster.state_dir / "sim" / "targets.json") in config
    target = wait_for(lambda: next(
        (t for t in _targets(dev_env) if t["labels"]["job"] == "kimik3-operator" and t["health"] == "up"), None),
        60.0, "the operator target to be up")
    assert target["scrapeUrl"] == dev_env.state["urls"]["operator"] + "/metrics"


def test_prometheus_holds_the_simulated_engines_itl_with_podmonitor_labels(dev_env: DevEnv, ns: str) -> None:
    if "sim" not in {r.name for r in dev_env.cluster.running()}:
        pytest.skip("this checkout has no `kimik3 dev sim`: dev up did not start the engine simulator")
    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    dev_env.apply(cr)
    target = wait_for(lambda: next((t for t in _targets(dev_env) if t["labels"].get("namespace") == ns), None), 60.0,
                      "an engine target of the deployment")
    labels = target["labels"]
    assert (labels["job"], labels["deployment"], labels["group"], labels["role"]) == \
        ("kimik3-engines", "k3", "0", "leader")
    assert target["scrapeUrl"].startswith("http://127.0.0.1:")

    endpoints = dev_env.cluster.state_dir / "sim" / "endpoints.json"
    url = wait_for(lambda: (
        (e := json.loads(endpoints.read_text()).get(f"{ns}/k3")) and e["groups"].get("0", {}).get("ready")
        and e["url"]), 60.0, "the deployment's group ready on the simulator")
    assert url.startswith("http://127.0.0.1:")
    body = json.dumps({"model": "kimi-k3", "prompt": "hello", "max_tokens": 16}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        completion = json.loads(resp.read())
    assert completion["usage"]["completion_tokens"] == 16

    query = ('sum(vllm:inter_token_latency_seconds_count{namespace="%s",deployment="k3",group="0",role="leader"})'
             % ns)

    def itl_count() -> float | None:
        status, raw = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}))
        result = json.loads(raw)["data"]["result"]
        return float(result[0]["value"][1]) if result and float(result[0]["value"][1]) > 0 else None
    count = wait_for(itl_count, 60.0, "Prometheus to hold the ITL series")
    assert count >= 1  # the engine observed inter-token latency for the 16 tokens (once per step)
