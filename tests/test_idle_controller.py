"""Idle stop and wake inside the reconcile, on a real kube-apiserver (spec.idle.stopAfter).

A Reconciler is driven directly with a fake clock, as in tests/test_autoscaling_controller.py:
the group leaders are a stand-in /metrics page on 127.0.0.1 read through the pod-scrape source
(the autoscaler's), and the test plays the LeaderWorkerSet controller and the kubelet (pods
Ready after a load of LOAD_S seconds, removed when the set shrinks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.cli import main
from kimik3.controller.activator import Activator, activator_app
from kimik3.controller.idle import request_wake
from kimik3.controller.reconcile import Reconciler
from kimik3.kube.kinds import HTTP_ROUTE, REFERENCE_GRANT
from kimik3.kube.labels import WAKE_REQUESTED_ANNOTATION
from kimik3.kube.times import rfc3339, rfc3339_seconds
from kimik3.render.wake import DEPLOYMENT_HEADER, UID_HEADER, WakeEndpoint
from support.cluster import CR, LWS, condition, events
from support.recipes import recipe
from support.reconciler import scraped_reconciler
from test_autoscaler_metrics import exposition

NAME, SET = "k3-latency", "k3-latency-engine"
ROUTE, GRANT = HTTP_ROUTE.type_meta, REFERENCE_GRANT.type_meta
ITL = "vllm:inter_token_latency_seconds"
LOAD_S = 754.0
"""The load each group takes in this test: its leader's Ready transition after its creation."""

pytestmark = pytest.mark.tier("apiserver")  # a ControlPlane of its own (own_control_plane)


@pytest.fixture
def env(own_control_plane) -> Iterator[dict]:
    with scraped_reconciler(own_control_plane, "idle") as e:
        yield e


def lws_controller(e: dict, loaded: bool = True) -> int:
    """What the LeaderWorkerSet controller and the kubelet would do for the set's spec.replicas:
    a Running leader per group, Ready ``LOAD_S`` after its creation (not ``loaded``: not Ready
    yet), none beyond; returns the groups."""
    core = client.CoreV1Api(e["api"])
    want = int(e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"])
    have = {p.metadata.name for p in core.list_namespaced_pod(e["ns"]).items}
    for g in range(want):
        name = f"{SET}-{g}"
        if name in have:
            continue
        pod = core.create_namespaced_pod(e["ns"], {"metadata": {"name": name, "labels": {
            "leaderworkerset.sigs.k8s.io/name": SET, "leaderworkerset.sigs.k8s.io/group-index": str(g),
            "leaderworkerset.sigs.k8s.io/worker-index": "0", "app.kubernetes.io/managed-by": "kimik3-operator",
            "inference.kimik3.io/deployment": NAME}}, "spec": {"containers": [{"name": "engine", "image": "x"}]}})
        ready_at = rfc3339(pod.metadata.creation_timestamp.timestamp() + LOAD_S)
        core.patch_namespaced_pod_status(name, e["ns"], {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True" if loaded else "False", "lastTransitionTime": ready_at}]}})
    for name in have:
        if int(name.rsplit("-", 1)[1]) >= want:
            core.delete_namespaced_pod(name, e["ns"], grace_period_seconds=0)
    e["kube"].patch_merge(*LWS, e["ns"], SET, {"status": {"replicas": want, "readyReplicas": want if loaded else 0}},
                          subresource="status")
    return want


def tick(e: dict, seconds: float = 30, loaded: bool = True) -> dict:
    e["clock"][0] += seconds
    e["rec"].reconcile(e["ns"], NAME)
    lws_controller(e, loaded)
    e["rec"].reconcile(e["ns"], NAME)
    return e["kube"].get(*CR, e["ns"], NAME)


def traffic(e: dict, running: float) -> None:
    e["leader"].text = exposition(ITL, {0: [0.01] * int(running)}, running=running, tokens=0)


def started(e: dict, stop_after: str = "2m", **spec) -> dict:
    """Two groups serving with traffic; the idle clock warmed up (the pod-scrape source covers its
    window); the CR after the last busy reading. ``spec``: more of the spec (``recipe``)."""
    body = recipe(namespace=e["ns"], replicas=2, idle={"stopAfter": stop_after}, autoscaling={
        "metricsSource": {"type": "podScrape"}, "interval": "30s", "window": "1m"}, **spec)
    e["kube"].apply(body, force=False)
    e["rec"].reconcile(e["ns"], NAME)
    traffic(e, 3)
    obj = {}
    for _ in range(4):
        obj = tick(e)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2
    assert condition(obj, "Stopped")["status"] == "False"
    return obj


def stop(e: dict) -> tuple[float, dict]:
    """Traffic ends; ticks until the deployment stops. Returns (seconds from the last busy
    reading to the stop, the CR)."""
    busy = e["clock"][0]
    traffic(e, 0)
    for _ in range(20):
        obj = tick(e)
        if condition(obj, "Stopped").get("status") == "True":
            return e["clock"][0] - busy, obj
    raise AssertionError(f"not stopped: {condition(obj, 'Stopped')}")


def test_stops_at_its_time_holds_no_group_and_wakes_on_request(env):
    e = env
    started(e)
    after, obj = stop(e)
    assert after == 120  # spec.idle.stopAfter: 2m of quiet back-to-back readings, not one tick sooner
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 0
    assert client.CoreV1Api(e["api"]).list_namespaced_pod(e["ns"]).items == []
    obj = tick(e)  # the set shrank: the status sees it
    idle = obj["status"]["idle"]
    assert idle["stoppedAt"] == rfc3339(e["clock"][0] - 30)
    assert idle["wakeEstimateSeconds"] == LOAD_S
    assert idle["stoppedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["replicas"] == 0
    stopped = condition(obj, "Stopped")
    assert (stopped["reason"], condition(obj, "Ready")["reason"]) == ("IdleTimeout", "IdleTimeout")
    assert "about 754s" in stopped["message"] and f"kimik3 wake {NAME} -n {e['ns']}" in stopped["message"]
    [event] = events(e["api"], e["ns"], "IdleTimeout")
    assert "2 group(s) removed" in event.message and "about 754s" in event.message
    # still stopped while nothing asks: no reading restarts it
    for _ in range(4):
        obj = tick(e)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 0

    woke_at = e["clock"][0] + 30
    request_wake(e["kube"], e["ns"], NAME, now=woke_at)
    obj = tick(e)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2  # back to spec.replicas
    assert obj["status"]["idle"] == {"wokeAt": rfc3339(woke_at)}
    assert condition(obj, "Stopped")["reason"] == "Active"
    [woken] = events(e["api"], e["ns"], "Woken")
    assert WAKE_REQUESTED_ANNOTATION in woken.message and "about 754s" in woken.message
    # the idle clock restarts from the wake: quiet from then on, it stops 2m later again
    after, obj = stop(e)
    assert rfc3339_seconds(obj["status"]["idle"]["stoppedAt"]) - woke_at == 120


def with_wake(e: dict) -> WakeEndpoint:
    """The operator's wake Service in a namespace of its own, and the test's Reconciler (``rec``)
    made again with it, as ``kimik3 run --wake-service`` makes it (a fresh process: nothing in memory)."""
    wake = WakeEndpoint(f"{e['ns']}-op", "kimik3-operator-wake", 8081)
    with contextlib.suppress(ApiException):  # made by an earlier with_wake of this test
        client.CoreV1Api(e["api"]).create_namespace({"metadata": {"name": wake.namespace}})
    e["rec"] = Reconciler(e["kube"], autoscaling=e["rec"].autoscaling, wake=wake)
    return wake


def route_backend(e: dict) -> tuple[dict, list]:
    """The HTTPRoute's one rule: its backendRef and its filters."""
    (rule,) = e["kube"].get(*ROUTE, e["ns"], NAME)["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend.pop("weight") == 1  # the API server's default
    return backend, rule.get("filters", [])


def test_a_stopped_deployments_route_goes_to_the_wake_endpoint_and_a_request_wakes_it(env):
    e = env
    wake = with_wake(e)
    started(e, service={"httpRoute": {"parentRefs": [{"name": "gw"}]}})
    service = {"group": "", "kind": "Service", "name": NAME, "port": 8000}
    assert route_backend(e) == (service, [])  # serving: the route goes to the engines
    stop(e)
    backend, filters = route_backend(e)
    assert backend == {"group": "", "kind": "Service", "name": wake.service, "namespace": wake.namespace,
                       "port": wake.port}
    uid = e["kube"].get(*CR, e["ns"], NAME)["metadata"]["uid"]
    assert filters == [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": DEPLOYMENT_HEADER, "value": f"{e['ns']}/{NAME}"}, {"name": UID_HEADER, "value": uid}]}}]
    grant = e["kube"].get(*GRANT, wake.namespace, f"kimik3-wake-{e['ns']}")
    assert grant["spec"] == {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": e["ns"]}],
                             "to": [{"group": "", "kind": "Service", "name": wake.service}]}

    activator = Activator(lambda ns, name, uid: request_wake(e["kube"], ns, name, uid=uid))

    async def request(uid: str) -> tuple[int, str | None]:
        async with TestClient(TestServer(activator_app(activator))) as http:
            response = await http.post("/v1/chat/completions", json={"messages": []},
                                       headers={DEPLOYMENT_HEADER: f"{e['ns']}/{NAME}", UID_HEADER: uid})
            return response.status, response.headers.get("Retry-After")
    # a route of another tenant naming this deployment but not its uid: the API server's uid precondition refuses
    assert asyncio.run(request(str(uuid.uuid4()))) == (404, None)
    assert WAKE_REQUESTED_ANNOTATION not in (e["kube"].get(*CR, e["ns"], NAME)["metadata"].get("annotations") or {})
    assert asyncio.run(request(uid)) == (503, str(int(LOAD_S)))  # at once, with the measured load time
    assert WAKE_REQUESTED_ANNOTATION in e["kube"].get(*CR, e["ns"], NAME)["metadata"]["annotations"]
    obj = tick(e, loaded=False)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2  # woken by the request
    assert condition(obj, "Stopped")["reason"] == "Active"
    assert route_backend(e)[0]["name"] == wake.service  # loading: requests still get 503 + Retry-After
    tick(e, loaded=False)
    assert route_backend(e)[0]["name"] == wake.service
    for _ in range(2):  # the groups Ready: the next reconcile sends requests to them again
        tick(e)
    assert route_backend(e) == (service, [])


def test_kimik3_wake_from_the_cli(env):
    e = env
    started(e)
    stop(e)
    out = CliRunner().invoke(main, ["wake", NAME, "-n", e["ns"], "--kubeconfig", str(e["cp"].admin_kubeconfig)])
    assert out.exit_code == 0, out.output
    assert f"{e['ns']}/{NAME}: wake requested (stopped since" in out.output and "about 754s" in out.output
    assert rfc3339_seconds(e["kube"].get(*CR, e["ns"], NAME)["metadata"]["annotations"][WAKE_REQUESTED_ANNOTATION])
    tick(e)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2
    missing = CliRunner().invoke(main, ["wake", "nope", "-n", e["ns"], "--kubeconfig", str(e["cp"].admin_kubeconfig)])
    assert missing.exit_code == 1 and f"no KimiK3Deployment nope in namespace {e['ns']}" in missing.output
    # Without spec.idle.stopAfter there is no idle clock: said so, nothing annotated
    e["kube"].patch_merge(*CR, e["ns"], NAME, {"metadata": {"annotations": {WAKE_REQUESTED_ANNOTATION: None}},
                                               "spec": {"idle": None, "autoscaling": None}})
    plain = CliRunner().invoke(main, ["wake", NAME, "-n", e["ns"], "--kubeconfig", str(e["cp"].admin_kubeconfig)])
    assert plain.exit_code == 0, plain.output
    assert plain.output == (f"{e['ns']}/{NAME}: no spec.idle.stopAfter, so it never stops when idle and there is "
                            "nothing to wake (its groups follow spec.replicas or spec.autoscaling); left as it is\n")
    assert WAKE_REQUESTED_ANNOTATION not in e["kube"].get(*CR, e["ns"], NAME)["metadata"].get("annotations", {})


def test_scaling_through_the_scale_subresource_wakes_it(env):
    e = env
    started(e)
    stop(e)
    e["kube"].patch_merge(*CR, e["ns"], NAME, {"spec": {"replicas": 3}}, subresource="scale")
    obj = tick(e)
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 3
    assert condition(obj, "Stopped")["reason"] == "Active"
    [woken] = events(e["api"], e["ns"], "Woken")
    assert "the spec changed" in woken.message


def test_an_unreadable_source_never_stops_it(env):
    e = env
    started(e)
    e["leader"].text = "not a metrics page {"
    for _ in range(10):
        obj = tick(e)
    assert condition(obj, "Stopped")["status"] == "False"
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2


def test_the_clock_does_not_run_while_a_woken_group_loads(env):
    e = env
    started(e)
    stop(e)
    request_wake(e["kube"], e["ns"], NAME, now=e["clock"][0] + 30)
    for _ in range(10):  # 300 s of loading, no request: longer than stopAfter (2m)
        obj = tick(e, loaded=False)
    assert condition(obj, "Stopped")["reason"] == "Active"
    assert e["kube"].get(*LWS, e["ns"], SET)["spec"]["replicas"] == 2


def sleeping(e: dict, name: str, namespace: str | None = None) -> None:
    """A deployment with spec.idle.stopAfter and an HTTPRoute, no group ever Ready (its route goes to
    the wake Service), reconciled once."""
    ns = namespace or e["ns"]
    e["kube"].apply(recipe(name=name, namespace=ns, replicas=1, idle={"stopAfter": "2m"},
                           autoscaling={"metricsSource": {"type": "podScrape"}},
                           service={"httpRoute": {"parentRefs": [{"name": "gw"}]}}), force=False)
    assert e["rec"].reconcile(ns, name).outcome == "applied"


def deleted(e: dict, name: str) -> None:
    """Delete the CR and reconcile it (no LeaderWorkerSet controller or pods here: the teardown runs
    through at once) until the reconcile finds it gone."""
    e["kube"].delete(*CR, e["ns"], name)
    outcomes = [e["rec"].reconcile(e["ns"], name).outcome for _ in range(6)]
    assert "deleted" in outcomes and outcomes[-1] == "gone", outcomes


def grant_of(e: dict, wake: WakeEndpoint, namespace: str | None = None) -> dict | None:
    return e["kube"].get(*GRANT, wake.namespace, f"kimik3-wake-{namespace or e['ns']}")


def test_the_grant_goes_with_the_last_deployment_that_needs_it(env, caplog):
    e = env
    wake = with_wake(e)
    sleeping(e, NAME)
    sleeping(e, "k3-second")
    assert grant_of(e, wake) is not None
    deleted(e, NAME)
    assert grant_of(e, wake) is not None  # k3-second's route may still go to the wake Service
    with caplog.at_level(logging.INFO, logger="kimik3.grants"):
        deleted(e, "k3-second")
    assert grant_of(e, wake) is None
    [line] = [r.getMessage() for r in caplog.records if r.name == "kimik3.grants"]
    assert line == (f"deleted ReferenceGrant {wake.namespace}/kimik3-wake-{e['ns']} (HTTPRoutes of namespace {e['ns']} "
                    f"may no longer name the wake Service {wake}): {e['ns']}/k3-second was deleted; no "
                    f"KimiK3Deployment in namespace {e['ns']} has spec.idle.stopAfter and spec.service.httpRoute any more")


def test_a_deployment_edited_not_to_need_the_grant_releases_it(env):
    e = env
    wake = with_wake(e)
    sleeping(e, NAME)
    e["kube"].apply(recipe(namespace=e["ns"], replicas=1, service={}), force=False)  # no stopAfter, no route
    assert "stopAfter" not in (e["kube"].get(*CR, e["ns"], NAME)["spec"].get("idle") or {})
    e["rec"].reconcile(e["ns"], NAME)
    assert grant_of(e, wake) is None
    sleeping(e, NAME)  # needed again: applied again (this process had forgotten it)
    assert grant_of(e, wake) is not None


def test_a_restarted_operator_sweeps_the_grant_of_a_deleted_namespace(env, caplog):
    e = env
    wake = with_wake(e)
    tenant = f"{e['ns']}-gone"
    core = client.CoreV1Api(e["api"])
    core.create_namespace({"metadata": {"name": tenant}})
    sleeping(e, NAME)
    sleeping(e, NAME, tenant)
    assert grant_of(e, wake, tenant) is not None
    core.delete_namespace(tenant)  # Terminating (no namespace controller here: its deployment stays)
    with_wake(e)  # a restart: nothing in memory
    with caplog.at_level(logging.INFO, logger="kimik3.grants"):
        assert e["rec"].reconcile(e["ns"], "not-there").outcome == "gone"  # the first reconcile sweeps
    assert grant_of(e, wake, tenant) is None
    assert grant_of(e, wake) is not None  # e["ns"] still has a deployment that needs it
    [line] = [r.getMessage() for r in caplog.records if r.name == "kimik3.grants"]
    assert line.endswith(f": found by the sweep; namespace {tenant} is being deleted"), line
