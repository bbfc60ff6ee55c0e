"""The dev Prometheus runs the configuration the real Prometheus Operator generates
(``kimik3_dev.devcluster.promoperator``): the operator's rendered PodMonitor and the chart's
ServiceMonitor become scrape jobs with their relabelings; Prometheus discovers the engines through
the API server and scrapes them at their leader pods' IPs, where they also answer completions (and
through the deployment's Service); the operator's /metrics is a static target."""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from devenv import DevEnv

from kimik3_dev.devcluster import promoperator
from kimik3_dev.devcluster.rbac import render_chart
from kimik3_dev.devcluster.readiness import http_get
from kimik3_dev.sim.load import resolve_url
from support.waiting import wait_for


def _targets(env: DevEnv) -> list[dict]:
    status, body = http_get(env.state["urls"]["prometheus"] + "/api/v1/targets?state=active")
    assert status == 200, body
    return json.loads(body)["data"]["activeTargets"]


def _loaded_job(env: DevEnv, job_name: str) -> dict | None:
    """The scrape job ``job_name`` of the configuration Prometheus runs (its /api/v1/status/config)."""
    status, body = http_get(env.state["urls"]["prometheus"] + "/api/v1/status/config")
    assert status == 200, body
    config = yaml.safe_load(json.loads(body)["data"]["yaml"])
    return next((j for j in config.get("scrape_configs") or [] if j["job_name"] == job_name), None)


def _relabel(job: dict, target_label: str) -> dict:
    (found,) = [r for r in job["relabel_configs"] if r.get("target_label") == target_label]
    return found


def _keeps(job: dict) -> dict[tuple[str, ...], str]:
    """source labels -> regex of the job's ``keep`` relabelings."""
    return {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}


def test_prometheus_runs_the_operators_generated_config_and_scrapes_the_operator(dev_env: DevEnv) -> None:
    """The file Prometheus runs is the Prometheus Operator's Secret, decompressed; the operator's
    /metrics comes through additionalScrapeConfigs (job kimik3-operator) every second, its own
    interval (``promoperator.OPERATOR_SCRAPE_INTERVAL``), not the Prometheus resource's 5 s."""
    secret = dev_env.rest.get(f"/api/v1/namespaces/{promoperator.NAMESPACE}/secrets/{promoperator.CONFIG_SECRET}")
    generated = promoperator.read_config(secret)
    assert generated is not None
    # only the rule files' folder is a pod's path: the reloader writes them on the host and points there
    assert "/etc/prometheus" not in generated.replace(promoperator.CONTAINER_RULES_DIR, "")
    config = promoperator.config_file(dev_env.cluster.state_dir)
    # as the config-reloader writes it: the pod's environment expanded ($(SHARD) -> 0), rules on the host
    assert config.read_text() == promoperator.expand(generated).replace(promoperator.CONTAINER_RULES_DIR,
                                                                        f"{promoperator.rules_dir(config)}/")
    job = _loaded_job(dev_env, promoperator.OPERATOR_JOB)
    assert job is not None and job["scrape_interval"] == "1s"
    target = wait_for(lambda: next(
        (t for t in _targets(dev_env) if t["labels"]["job"] == "kimik3-operator" and t["health"] == "up"), None),
        60.0, "the operator target to be up")
    assert target["scrapeUrl"] == dev_env.state["urls"]["operator"] + "/metrics"


def test_the_rendered_podmonitor_becomes_a_pod_discovery_job_with_its_relabelings(dev_env: DevEnv, ns: str) -> None:
    """The operator's PodMonitor, read by the real Prometheus Operator: Kubernetes SD (role pod)
    against the dev API server in the deployment's namespace, the leader pods' ``http`` port kept,
    and ``namespace``/``deployment``/``group`` labels from the pod's metadata; Prometheus reloaded
    with it (its /api/v1/status/config holds the job)."""
    dev_env.apply(dev_env.deployment(ns, replicas=1))
    job = wait_for(lambda: _loaded_job(dev_env, f"podMonitor/{ns}/k3/0"), 60.0,
                   "Prometheus to run the PodMonitor's job")
    (sd,) = job["kubernetes_sd_configs"]
    assert (sd["role"], sd["namespaces"]["names"], sd["api_server"]) == ("pod", [ns], dev_env.state["server"])
    assert sd["tls_config"]["ca_file"].endswith("ca.crt")
    assert sd["authorization"]["credentials_file"] == str(dev_env.cluster.state_dir / "prometheus" / "apiserver.token")
    assert job["scrape_interval"] == "15s" and job["metrics_path"] == "/metrics"
    assert _relabel(job, "namespace")["source_labels"] == ["__meta_kubernetes_namespace"]
    assert _relabel(job, "deployment")["source_labels"] == [
        "__meta_kubernetes_pod_label_inference_kimik3_io_deployment"]
    assert _relabel(job, "group")["source_labels"] == [
        "__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_group_index"]
    keeps = _keeps(job)
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "http"
    assert keeps[("__meta_kubernetes_pod_label_leaderworkerset_sigs_k8s_io_worker_index",
                  "__meta_kubernetes_pod_labelpresent_leaderworkerset_sigs_k8s_io_worker_index")] == "(0);true"
    assert keeps[("__address__",)] == promoperator.LOOPBACK_ONLY["regex"]
    assert keeps[("__tmp_hash", "__tmp_disable_sharding")] == "0;|.+;.+"  # $(SHARD) expanded
    (rename,) = job["metric_relabel_configs"]
    assert (rename["source_labels"], rename["regex"], rename["target_label"], rename["replacement"]) == \
        (["__name__"], "vllm_(.+)", "__name__", "vllm:$1")


def test_the_charts_servicemonitor_becomes_an_endpointslice_job(dev_env: DevEnv, ns: str) -> None:
    """The chart's ServiceMonitor (``helm template`` with metrics.serviceMonitor.enabled, release
    namespace ``ns``), read by the real Prometheus Operator: EndpointSlice discovery in ``ns``,
    the metrics Service's selector labels and port ``http-metrics`` kept, the chart's interval
    and timeout. (Here the operator listens on 127.0.0.1, which the API server refuses in
    EndpointSlices: it is scraped through a static target instead.)"""
    (monitor,) = [d for d in render_chart("--set", "metrics.serviceMonitor.enabled=true", namespace=ns)
                  if d["kind"] == "ServiceMonitor"]
    name = monitor["metadata"]["name"]
    dev_env.rest.apply(f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors/{name}", monitor)
    job = wait_for(lambda: _loaded_job(dev_env, f"serviceMonitor/{ns}/{name}/0"), 60.0,
                   "Prometheus to run the ServiceMonitor's job")
    (sd,) = job["kubernetes_sd_configs"]
    assert (sd["role"], sd["namespaces"]["names"], sd["api_server"]) == ("endpointslice", [ns], dev_env.state["server"])
    assert (job["scrape_interval"], job["scrape_timeout"], job["metrics_path"]) == ("30s", "10s", "/metrics")
    keeps = _keeps(job)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "metrics"
    for label, value in selector.items():
        meta = "".join(c if c.isalnum() else "_" for c in label)
        assert keeps[(f"__meta_kubernetes_service_label_{meta}", f"__meta_kubernetes_service_labelpresent_{meta}")] \
            == f"({value});true"
    assert keeps[("__meta_kubernetes_endpointslice_port_name",)] == "http-metrics"


def test_prometheus_holds_the_simulated_engines_itl_with_podmonitor_labels(dev_env: DevEnv, ns: str) -> None:
    if "sim" not in {r.name for r in dev_env.cluster.running()}:
        pytest.skip("this checkout has no `kimik3 dev sim`: dev up did not start the engine simulator")
    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    dev_env.apply(cr)
    target = wait_for(lambda: next((t for t in _targets(dev_env) if t["labels"].get("namespace") == ns), None), 60.0,
                      "an engine target of the deployment")
    labels = target["labels"]
    # the job and labels the real Prometheus Operator gives the PodMonitor's targets
    assert target["scrapePool"] == f"podMonitor/{ns}/k3/0"
    assert (labels["job"], labels["deployment"], labels["group"], labels["role"], labels["endpoint"]) == \
        (f"{ns}/k3", "k3", "0", "leader", "http")
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


def test_the_usage_rules_are_loaded_by_the_prometheus_operator_and_record_gpu_time(dev_env: DevEnv, ns: str) -> None:
    """Issue 28: the PrometheusRule ``dev up`` applies (the chart's usage rules) is rendered by the
    real Prometheus Operator into its rule-file ConfigMap, written by the reloader and loaded by
    Prometheus (its /api/v1/rules); a deployment's GPU time then appears in the recorded series."""
    from kimik3.usage.rules import GROUP_NAME, rule_groups

    def loaded() -> list[str] | None:
        status, raw = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/rules?type=record")
        groups = [g for g in json.loads(raw)["data"]["groups"] if g["name"] == GROUP_NAME] if status == 200 else []
        return [r["name"] for g in groups for r in g["rules"]] or None
    names = wait_for(loaded, 60.0, "Prometheus to load the usage rules")
    assert names == [r["record"] for r in rule_groups()["groups"][0]["rules"]]

    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    dev_env.apply(cr)
    query = 'sum(namespace_deployment_revision_state_capacity:kimik3_gpu_seconds:increase1h{namespace="%s",state="held"})' % ns

    def gpu_seconds() -> float | None:
        status, raw = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}))
        result = json.loads(raw)["data"]["result"] if status == 200 else []
        return float(result[0]["value"][1]) if result and float(result[0]["value"][1]) > 0 else None
    held = wait_for(gpu_seconds, 90.0, "the recorded GPU-seconds held of the deployment")
    gpus = sum(int(c["resources"]["limits"]["nvidia.com/gpu"]) for p in dev_env.pods(ns)
               for c in p["spec"]["containers"] if "nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {}))
    assert 0 < held <= gpus * 120  # held for at most the two minutes since the apply
