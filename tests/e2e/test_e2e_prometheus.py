"""The dev Prometheus (Debian's package) scrapes on loopback: the operator's /metrics, and the
engine simulator's engines at their leader pods' IPs through the file_sd file it writes
(``<state>/sim/targets.json``); those engines answer completions at the pod IP and through the
deployment's Service."""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from devenv import DevEnv

from kimik3_dev.devcluster.readiness import http_get
from kimik3_dev.sim.load import resolve_url
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
    # the engine is where vLLM would be: the leader pod's IP (from the API server, one of the
    # cluster's own 127.N.0.0/16) and the container's API port
    leader = next(p for p in dev_env.pods(ns) if p["metadata"]["name"] == labels["pod"])
    pod_ip = leader["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(dev_env.state["pod_network"])
    assert pod_ip != "127.0.0.1"
    port = next(p["containerPort"] for c in leader["spec"]["containers"] for p in c.get("ports") or []
                if p["name"] == "http")
    assert target["scrapeUrl"] == f"http://{pod_ip}:{port}/metrics"

    body = json.dumps({"model": "kimi-k3", "prompt": "hello", "max_tokens": 16}).encode()

    def complete(url: str) -> dict[str, Any] | None:
        request = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError):
            return None  # loading (503) or the Service without a Ready endpoint yet
    completion = wait_for(lambda: complete(f"http://{pod_ip}:{port}"), 60.0, "the leader pod's engine to answer")
    assert completion["usage"]["completion_tokens"] == 16
    # and through the deployment's Service (status.endpoint), as a client in the cluster reaches it
    def through_service() -> tuple[str, str | None] | None:
        try:  # the Service sends to the leader once the prober saw it loaded (the next poll)
            found = resolve_url(dev_env.cluster.kubeconfig, dev_env.cluster.state_dir, "k3", ns)
        except LookupError:
            return None
        return found if found[1] is not None else None
    url, model = wait_for(through_service, 60.0, "the Service to serve the model")
    assert model == "kimi-k3"
    assert wait_for(lambda: complete(url), 60.0, "the Service to answer")["usage"]["completion_tokens"] == 16

    query = ('sum(vllm:inter_token_latency_seconds_count{namespace="%s",deployment="k3",group="0",role="leader"})'
             % ns)

    def itl_count() -> float | None:
        status, raw = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}))
        result = json.loads(raw)["data"]["result"]
        return float(result[0]["value"][1]) if result and float(result[0]["value"][1]) > 0 else None
    count = wait_for(itl_count, 60.0, "Prometheus to hold the ITL series")
    assert count >= 1  # the engine observed inter-token latency for the 16 tokens (once per step)
