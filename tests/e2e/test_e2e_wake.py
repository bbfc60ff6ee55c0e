"""The gateway wake on the session's dev cluster (spec.idle.stopAfter, ``kimik3.render.wake``): a
deployment with routing and an HTTPRoute stops after a minute without a request and holds no pod;
its HTTPRoute then names the operator's wake Service, and ``dev gateways`` sends what Envoy
receives for it to the operator's activator. A request through Envoy is answered at once with 503
and ``Retry-After`` (the load time measured before the stop) and wakes the deployment; a client
that retries as told is served by a leader once the group is Ready and the route names the pool
again.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from devenv import DevEnv

from kimik3.kube import pods as kpods
from kimik3_dev.devcluster import gateway
from kimik3_dev.devcluster.cluster import WAKE_SERVICE
from kimik3_dev.sim import services
from kimik3_dev.sim.load import resolve_url
from support.waiting import wait_for

WAIT_S = 120.0
STOP_AFTER_S = 60
"""spec.idle.stopAfter: the shortest the API allows (1m)."""
WAKE_WITHIN_S = 10.0
"""From the request through the gateway to the operator's wake (status.idle.wokeAt), at most."""


def _envoy_routes_to(state_dir, ns: str) -> str:
    """The cluster Envoy's one virtual host sends to first, as ``dev gateways`` last wrote it."""
    written = json.loads((state_dir / "gateway" / f"{ns}-k3" / gateway.ROUTES_FILE).read_text())
    return written["resources"][0]["virtual_hosts"][0]["routes"][0]["route"]["cluster"]


def _backend(dev_env: DevEnv, ns: str) -> str | None:
    route = dev_env.rest.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/k3")
    return route and route["spec"]["rules"][0]["backendRefs"][0]["name"]


@pytest.mark.timeout(360)
def test_a_request_through_the_gateway_wakes_a_stopped_deployment_and_a_retry_is_served(dev_env: DevEnv,
                                                                                         ns: str) -> None:
    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "3s"}  # simulator-only override
    cr["spec"]["routing"] = {"enabled": True}
    cr["spec"].setdefault("service", {})["httpRoute"] = {"parentRefs": [{"name": "gw"}]}
    cr["spec"]["idle"] = {"stopAfter": f"{STOP_AFTER_S}s"}
    cr["spec"]["autoscaling"] = {"metricsSource": {"type": "podScrape"}, "interval": "5s", "window": "10s"}
    dev_env.apply(cr)
    state_dir = dev_env.cluster.state_dir
    wait_for(lambda: services.gateway_address(state_dir, ns, "k3"), WAIT_S,
             f"`dev gateways` to record a listener for InferencePool {ns}/k3")
    wait_for(lambda: _backend(dev_env, ns) == "k3", WAIT_S, "the group Ready and the route to the pool")
    url, model = wait_for(lambda: (found := resolve_url(dev_env.cluster.kubeconfig, state_dir, "k3", ns,
                                                        via_gateway=True))[1] and found, WAIT_S, "the served model")

    # No request for stopAfter: stopped, no pod (0 GPUs held), the route at the wake Service, Envoy following it.
    stopped = wait_for(lambda: (c := dev_env.condition(ns, "Stopped")) and c["status"] == "True" and c,
                       STOP_AFTER_S + WAIT_S, "Stopped=True after spec.idle.stopAfter")
    assert stopped["reason"] == "IdleTimeout", stopped
    wait_for(lambda: not dev_env.pods(ns), WAIT_S, "every pod of the stopped deployment gone")
    idle = dev_env.get_cr(ns)["status"]["idle"]
    estimate = idle["wakeEstimateSeconds"]
    # The measured load (controller.autoscaling.load_seconds: first pod created to last pod Ready). The
    # session's dev cluster runs without --readiness-probes, so kwok marks the pods Ready as it starts
    # them, not after the simulator's 3 s load: 0-3 s (whole seconds, both timestamps), 0 when kwok starts
    # the pods within the second they were created (read once in a full CI run, b6d48bc). Retry-After is
    # then 1 s, which the rest of the test holds.
    assert 0 <= estimate < 30, idle
    assert _backend(dev_env, ns) == WAKE_SERVICE.service
    wait_for(lambda: _envoy_routes_to(state_dir, ns) == "wake", 10, "Envoy routing to the operator's activator")

    # The first request: answered at once with 503 and Retry-After; the deployment wakes.
    sent = time.monotonic()
    first = requests.post(f"{url}/v1/completions", json={"model": model, "prompt": "wake up", "max_tokens": 4},
                          timeout=10)
    answered = time.monotonic() - sent
    assert first.status_code == 503, (first.status_code, first.text[:300])
    assert int(first.headers["Retry-After"]) == max(1, -(-estimate // 1)), first.headers
    assert answered < 2.0, answered
    wait_for(lambda: (dev_env.get_cr(ns)["status"].get("idle") or {}).get("wokeAt"), WAKE_WITHIN_S,
             "the operator's wake (status.idle.wokeAt)")
    woke_s = time.monotonic() - sent
    assert woke_s <= WAKE_WITHIN_S, woke_s

    # A client that retries as told is served once the group is Ready and the route names the pool again.
    deadline, tries, response = time.monotonic() + WAIT_S, 1, first
    while response.status_code != 200 and time.monotonic() < deadline:
        time.sleep(int(response.headers.get("Retry-After", "1")))
        response = requests.post(f"{url}/v1/completions", json={"model": model, "prompt": "wake up", "max_tokens": 4},
                                 timeout=30)
        tries += 1
    assert response.status_code == 200, (tries, response.status_code, response.text[:300])
    leaders = {f"{p['status']['podIP']}:{c['containerPort']}" for p in dev_env.pods(ns) if kpods.is_leader(p)
               for c in p["spec"]["containers"][0]["ports"]}
    assert response.headers[gateway.SERVED_HEADER] in leaders, (response.headers.get(gateway.SERVED_HEADER), leaders)
    assert _backend(dev_env, ns) == "k3" and _envoy_routes_to(state_dir, ns) == "pool"
