"""The dev cluster's inference gateway (``kimik3_dev.devcluster.gateway``): a real endpoint picker
(``cmd/epp`` of the Gateway API Inference Extension v1.2.1) against the dev API server and a real
Envoy calling it through ext_proc, in front of an InferencePool written here by hand over a
deployment's leader pods (the engine simulator serves each engine at its leader's pod IP).

A completion through Envoy is answered by a leader the picker chose (the response's
``x-gateway-destination-endpoint-served`` names it; the picker's metrics count the request and list
exactly the leaders; a long prompt sent again lands on the same leader, the prefix-cache scorer), and killing the picker shows each failure mode: ``FailClose`` refuses,
``FailOpen`` still serves from a leader; started again, the picker serves again.

With ``spec.routing.enabled`` the operator renders the pool and its picker, and ``dev up``'s
``kimik3 dev gateways`` runs them (``kimik3_dev.devcluster.gatewaywatch``): the picker as the
rendered Deployment says, Envoy in front, the listener in ``gateways.json`` for
``dev load --via-gateway``; the CR's RoutingReady turns True; routing turned off, the gateway goes.
"""

from __future__ import annotations

import re

import pytest
import requests
from devenv import DevEnv

from kimik3.kube import pods as kpods
from kimik3.kube.labels import DEPLOYMENT_LABEL, LEADER_WORKER_INDEX, LWS_WORKER_INDEX_LABEL
from kimik3_dev.devcluster import gateway, processes
from kimik3_dev.devcluster.rollout import serving
from kimik3_dev.sim import services
from kimik3_dev.sim.load import resolve_url
from support.waiting import wait_for

WAIT_S = 120.0
GROUPS = 2
REQUESTS = 6


def _pool(namespace: str, name: str, port: int, mode: str) -> dict:
    """An InferencePool over the leaders of deployment ``k3`` (workers serve no HTTP) at the engine port."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": {DEPLOYMENT_LABEL: "k3", LWS_WORKER_INDEX_LABEL: LEADER_WORKER_INDEX}},
                     "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}, "failureMode": mode}}}


def _metrics(gw: gateway.Gateway) -> str:
    return requests.get(f"{gw.epp_metrics_url}/metrics", timeout=5).text


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample of ``name``."""
    return [(m.group(1), float(m.group(2))) for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)]


def _complete(gw: gateway.Gateway, model: str | None, prompt: str) -> requests.Response:
    return requests.post(f"{gw.url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4},
                         timeout=30)


@pytest.mark.timeout(420)
def test_envoy_forwards_to_the_leader_the_picker_chooses_and_honours_its_failure_mode(dev_env: DevEnv,
                                                                                        ns: str) -> None:
    cr = dev_env.deployment(ns, replicas=GROUPS)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    dev_env.apply(cr)
    _, model = serving(dev_env.rest, dev_env.cluster.state_dir, ns, "k3", GROUPS, 2, WAIT_S)
    leaders = {p["metadata"]["name"]: p for p in dev_env.pods(ns) if kpods.is_leader(p)}
    (port,) = {c["containerPort"] for p in leaders.values() for c in p["spec"]["containers"][0]["ports"]}
    endpoints = {f"{p['status']['podIP']}:{port}" for p in leaders.values()}
    assert len(endpoints) == GROUPS

    started: list[gateway.Gateway] = []
    try:
        for name, mode in (("k3-close", "FailClose"), ("k3-open", "FailOpen")):
            pool = _pool(ns, name, port, mode)
            dev_env.rest.create(f"{gateway.POOL_API}/namespaces/{ns}/inferencepools", pool)
            started.append(dev_env.cluster.start_gateway(ns, name, timeout_s=WAIT_S))
        close, open_ = started
        assert (close.failure_mode, open_.failure_mode) == ("FailClose", "FailOpen")

        for gw in started:
            # The picker sees exactly the leaders, each with fresh metrics (ready_pods counts those).
            wait_for(lambda gw=gw: gateway.pool_gauge(_metrics(gw), "inference_pool_ready_pods", gw.pool) == GROUPS,
                     WAIT_S, f"the picker of {gw.pool} to count {GROUPS} ready pods")
            seen = {re.sub(r"-rank-\d+$", "", re.search(r'model_server_pod="([^"]+)"', labels).group(1))
                    for labels, _ in _samples(_metrics(gw), "inference_pool_per_pod_queue_size")
                    if f'name="{gw.pool}"' in labels}
            assert seen == set(leaders)

            served = []
            for i in range(REQUESTS):
                resp = _complete(gw, model, f"request {i} through {gw.pool}")
                assert resp.status_code == 200, (resp.status_code, resp.text[:300])
                assert resp.json()["choices"][0]["text"]
                served.append(resp.headers[gateway.SERVED_HEADER])
            assert set(served) <= endpoints, (served, endpoints)
            # The prefix-cache scorer (weight 3 of 7): a long prompt sent again goes where it went first.
            # Longer than two of the picker's blocks: autoTune reads the engines' 1024-token blocks from
            # vllm:cache_config_info, 4096 characters each (~80 x 120 = ~9,600 characters here).
            shared = f"{gw.pool}: a long system prompt and tool schemas shared by every turn. " * 120
            again = {_complete(gw, model, shared).headers[gateway.SERVED_HEADER] for _ in range(6)}
            assert len(again) == 1 and again <= endpoints, again
            counted = sum(v for labels, v in _samples(_metrics(gw), "inference_objective_request_total")
                          if f'model_name="{model}"' in labels)
            assert counted == REQUESTS + 6

        # The picker gone (killed, as a crash): once Envoy's health check marks it unhealthy, FailClose
        # drops the request and FailOpen forwards it to a leader of Envoy's picking.
        for gw in started:
            dev_env.cluster.stop_component(gw.epp.name, kill=True)  # `kimik3 dev fault stop --kill`
        for gw in started:
            wait_for(lambda gw=gw: gateway.picker_health(gw.envoy_admin_url) != "healthy", 30,
                     f"Envoy of {gw.pool} to mark the killed picker unhealthy")
        refused = _complete(close, model, "after the picker")
        assert refused.status_code == 500, (refused.status_code, refused.text[:300])
        assert gateway.SERVED_HEADER not in refused.headers or not refused.headers[gateway.SERVED_HEADER]
        for i in range(3):
            resp = _complete(open_, model, f"after the picker {i}")
            assert resp.status_code == 200, (resp.status_code, resp.text[:300])
            assert resp.headers[gateway.SERVED_HEADER] in endpoints
        stats = requests.get(f"{open_.envoy_admin_url}/stats?filter=ext_proc.failure_mode_allowed", timeout=5).text
        assert re.search(r"^http\.pool\.ext_proc\.failure_mode_allowed: 3$", stats, re.M), stats

        # The picker back (`kimik3 dev fault start`, same ports): Envoy's health check finds it, FailClose serves.
        dev_env.cluster.start_component(close.epp.name)
        wait_for(lambda: gateway.picker_health(close.envoy_admin_url) == "healthy", 60,
                 "Envoy to find the restarted picker healthy")
        wait_for(lambda: gateway.pool_gauge(_metrics(close), "inference_pool_ready_pods", close.pool) == GROUPS,
                 WAIT_S, "the restarted picker to count its ready pods")
        resp = _complete(close, model, "with the picker back")
        assert resp.status_code == 200 and resp.headers[gateway.SERVED_HEADER] in endpoints, resp.status_code
    finally:
        for gw in started:
            gateway.stop(dev_env.cluster.state_dir, gw)


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.timeout(300)
def test_dev_up_runs_a_gateway_for_the_pool_the_operator_renders(dev_env: DevEnv, ns: str) -> None:
    cr = dev_env.deployment(ns, replicas=GROUPS)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    cr["spec"]["routing"] = {"enabled": True}
    dev_env.apply(cr)
    _, model = serving(dev_env.rest, dev_env.cluster.state_dir, ns, "k3", GROUPS, 2, WAIT_S)
    leaders = [p for p in dev_env.pods(ns) if kpods.is_leader(p)]
    (port,) = {c["containerPort"] for p in leaders for c in p["spec"]["containers"][0]["ports"]}
    endpoints = {f"{p['status']['podIP']}:{port}" for p in leaders}
    assert len(endpoints) == GROUPS

    state_dir = dev_env.cluster.state_dir
    url = wait_for(lambda: services.gateway_address(state_dir, ns, "k3"), WAIT_S,
                   f"`dev gateways` to record a listener for InferencePool {ns}/k3")
    assert resolve_url(dev_env.cluster.kubeconfig, state_dir, "k3", ns, via_gateway=True) == (url, model)
    # The picker runs as rendered: the ConfigMap's file, the Deployment's args (ports and config path the host's).
    epp = processes.read_record(state_dir, f"gateway-epp-{ns}-k3")
    assert epp is not None and epp.alive
    rendered = dev_env.rest.get(f"/apis/apps/v1/namespaces/{ns}/deployments/k3-epp")
    args = rendered["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [_flag(epp.argv, f) for f in ("--pool-name", "--kv-cache-usage-percentage-metric")] == \
        [_flag(args, f) for f in ("--pool-name", "--kv-cache-usage-percentage-metric")] == ["k3", "vllm:kv_cache_usage_perc"]
    configmap = dev_env.rest.get(f"/api/v1/namespaces/{ns}/configmaps/k3-epp")
    with open(_flag(epp.argv, "--config-file")) as f:
        assert f.read() == configmap["data"]["epp-config.yaml"]
    metrics = f"http://127.0.0.1:{_flag(epp.argv, '--metrics-port')}/metrics"

    routing = wait_for(lambda: (c := dev_env.condition(ns, "RoutingReady")) and c["status"] == "True" and c,
                       WAIT_S, "RoutingReady True")
    assert routing["status"] == "True", routing

    wait_for(lambda: gateway.pool_gauge(requests.get(metrics, timeout=5).text, "inference_pool_ready_pods",
                                        "k3") == GROUPS, WAIT_S, f"the picker to count {GROUPS} ready leaders")
    resp = requests.post(f"{url}/v1/completions", json={"model": model, "prompt": "through the pool", "max_tokens": 4},
                         timeout=30)
    assert resp.status_code == 200, (resp.status_code, resp.text[:300])
    assert resp.headers[gateway.SERVED_HEADER] in endpoints, (resp.headers.get(gateway.SERVED_HEADER), endpoints)
    counted = sum(v for labels, v in _samples(requests.get(metrics, timeout=5).text,
                                              "inference_objective_request_total") if f'model_name="{model}"' in labels)
    assert counted == 1

    # Routing off: the operator deletes the pool, the watcher stops its gateway and forgets its listener.
    dev_env.rest.call("PATCH", dev_env.cr_path(ns), body={"spec": {"routing": {"enabled": False}}},
                      content_type="application/merge-patch+json")
    wait_for(lambda: services.gateway_address(state_dir, ns, "k3") is None, WAIT_S, "the gateway of k3 to stop")
    assert not epp.alive
