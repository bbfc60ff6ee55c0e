"""spec.routing against a real kube-apiserver (no kube-controller-manager, no gateway controller: the
picker's Deployment, the InferencePool's gateways and the Gateway write no status of their own here,
so the tests write it as those controllers would):

- with the InferencePool CRD: the pool and the picker's children are created and owned, the route
  points at the pool; RoutingReady follows the picker's available replicas and a gateway's
  refusal of the pool, whose status.parents the CR mirrors; routing off removes them all;
- without it: the Service path, RoutingReady=False InferencePoolNotServed, nothing refused; once the
  CRD is installed the pool and picker follow;
- a Gateway whose listener does not admit the deployment's namespace: GatewayReady=False
  NamespaceNotAllowed (the "silent 404"), True once the listener admits it.
"""

from __future__ import annotations

from typing import Any

import pytest

from kimik3.controller.kube import Kube
from kimik3.controller.lateapis import PERIOD_S
from kimik3.kube.kinds import (CONFIG_MAP, DEPLOYMENT, GATEWAY, HTTP_ROUTE, INFERENCE_POOL, ROLE, ROLE_BINDING, SERVICE,
                               SERVICE_ACCOUNT)
from kimik3.kube.times import rfc3339
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.cluster import CR, apply, condition, fresh_namespace, reconciled, without_crd
from support.recipes import recipe
from support.waiting import wait_for

PICKER_KINDS = (SERVICE_ACCOUNT, ROLE, ROLE_BINDING, CONFIG_MAP, DEPLOYMENT, SERVICE)


def routed(name: str, gateway: dict[str, Any], **routing: Any) -> dict[str, Any]:
    return recipe("gb300-tp8-megakernel-dspark.yaml", name=name, routing={"enabled": True, **routing},
                  service={"httpRoute": {"parentRefs": [gateway]}})


def said(kube: Kube, namespace: str, name: str, type_: str, status: str, reason: str, timeout: float = 30) -> dict:
    """The condition ``type_`` once it is ``status``/``reason``."""
    def check():
        c = condition(kube.get(*CR, namespace, name), type_)
        return c if (c.get("status"), c.get("reason")) == (status, reason) else None
    return wait_for(check, timeout, f"{type_}={status} {reason} on {namespace}/{name}")


@pytest.fixture
def deployed(kube: Kube, namespace: str):
    """Apply a CR; delete it at the end and wait for the operator's teardown, so that no CR of this
    module is left reconciled (and failing its applies) in a namespace that stays Terminating."""
    names: list[str] = []

    def deploy(body: dict[str, Any]) -> dict[str, Any]:
        names.append(body["metadata"]["name"])
        return apply(kube, body, namespace)
    yield deploy
    for name in names:
        kube.delete(*CR, namespace, name)
    wait_for(lambda: all(kube.get(*CR, namespace, n) is None for n in names), 60, "the test's CRs torn down")


def status_patch(kube: Kube, kind, namespace: str, name: str, status: dict[str, Any]) -> None:
    kube.patch_merge(*kind.type_meta, namespace, name, {"status": status}, subresource="status")


def backends(kube: Kube, namespace: str, name: str) -> list[tuple[str, str, str, int | None]]:
    """(group, kind, name, port) of each backendRef of the HTTPRoute ``name``."""
    route = kube.get(*HTTP_ROUTE.type_meta, namespace, name)
    return [(b.get("group"), b["kind"], b["name"], b.get("port")) for b in route["spec"]["rules"][0]["backendRefs"]]


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": rfc3339()}


def test_routing_on_creates_the_pool_and_the_picker_and_reports_why_traffic_does_not_flow(operator, kube, namespace,
                                                                                         deployed):
    created = deployed(routed("k3-routed", {"name": "absent-gw"}))
    reconciled(kube, namespace, "k3-routed")
    pool = wait_for(lambda: kube.get(*INFERENCE_POOL.type_meta, namespace, "k3-routed"), 30, "the InferencePool")
    assert pool["spec"]["selector"]["matchLabels"] == {"inference.kimik3.io/deployment": "k3-routed",
                                                       "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "k3-routed-epp",
                                                 "port": {"number": 9002}, "failureMode": "FailOpen"}
    for kind in PICKER_KINDS:
        child = kube.get(*kind.type_meta, namespace, "k3-routed-epp")
        assert child is not None, f"{kind.kind} k3-routed-epp missing"
        assert child["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert backends(kube, namespace, "k3-routed") == [("inference.networking.k8s.io", "InferencePool", "k3-routed", None)]

    # No controller-manager runs: the picker has no available replica, and the condition says what FailOpen does.
    waiting = said(kube, namespace, "k3-routed", "RoutingReady", "False", "EndpointPickerNotReady")
    assert "k3-routed-epp has no available replica" in waiting["message"] and "FailOpen" in waiting["message"]
    gateway = said(kube, namespace, "k3-routed", "GatewayReady", "False", "GatewayNotFound")
    assert f"Gateway {namespace}/absent-gw does not exist" in gateway["message"]
    obj = kube.get(*CR, namespace, "k3-routed")
    assert obj["status"]["routing"] == {"backend": "InferencePool", "inferencePool": "k3-routed",
                                        "endpointPicker": "k3-routed-epp", "parents": []}
    assert condition(obj, "Degraded")["status"] == "False"

    # The picker becomes available (the Deployment controller's status): routed.
    status_patch(kube, DEPLOYMENT, namespace, "k3-routed-epp", {"replicas": 1, "readyReplicas": 1,
                                                                "availableReplicas": 1})
    said(kube, namespace, "k3-routed", "RoutingReady", "True", "Routed")

    # A gateway refuses the pool: mirrored into status.routing.parents and named by RoutingReady.
    status_patch(kube, INFERENCE_POOL, namespace, "k3-routed", {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge", "namespace": "infra"},
        "controllerName": "example.net/gateway",
        "conditions": [cond("Accepted", "True", "Accepted"),
                       cond("ResolvedRefs", "False", "InvalidExtensionRef", "Service k3-routed-epp has no port 9002")]}]})
    refused = said(kube, namespace, "k3-routed", "RoutingReady", "False", "PoolNotAccepted")
    assert refused["message"].startswith("Gateway infra/edge (example.net/gateway): InferencePool k3-routed "
                                         "ResolvedRefs=False InvalidExtensionRef: Service k3-routed-epp has no port 9002")
    (parent,) = kube.get(*CR, namespace, "k3-routed")["status"]["routing"]["parents"]
    assert parent["parentRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge",
                                   "namespace": "infra"}
    assert [(c["type"], c["status"], c["reason"]) for c in parent["conditions"]] == [
        ("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "InvalidExtensionRef")]

    # Routing off: the pool and every picker child go, the route goes back to the Service, the condition too.
    kube.patch_merge(*CR, namespace, "k3-routed", {"spec": {"routing": {"enabled": False}}})
    reconciled(kube, namespace, "k3-routed")
    wait_for(lambda: all(kube.get(*k.type_meta, namespace, "k3-routed-epp") is None for k in PICKER_KINDS)
             and kube.get(*INFERENCE_POOL.type_meta, namespace, "k3-routed") is None, 30, "the routing children gone")
    assert backends(kube, namespace, "k3-routed") == [("", "Service", "k3-routed", 8000)]
    assert kube.get(*SERVICE.type_meta, namespace, "k3-routed") is not None  # the client Service stays
    wait_for(lambda: not condition(kube.get(*CR, namespace, "k3-routed"), "RoutingReady"), 30, "RoutingReady removed")
    assert kube.get(*CR, namespace, "k3-routed")["status"]["routing"] == {"backend": "Service", "parents": []}


@pytest.fixture
def without_pool_crd(control_plane, admin_api):
    with without_crd(control_plane, admin_api, INFERENCE_POOL):
        yield


def test_without_the_pool_crd_the_service_path_and_a_condition_then_the_pool_once_installed(
        operator, control_plane, kube, namespace, without_pool_crd, deployed):
    deployed(routed("k3-fallback", {"name": "gw"}))
    reconciled(kube, namespace, "k3-fallback")
    fallback = said(kube, namespace, "k3-fallback", "RoutingReady", "False", "InferencePoolNotServed")
    assert fallback["message"].startswith("the API server does not serve inference.networking.k8s.io/v1 InferencePool: "
                                          "requests go to Service k3-fallback")
    assert backends(kube, namespace, "k3-fallback") == [("", "Service", "k3-fallback", 8000)]
    assert kube.get(*DEPLOYMENT.type_meta, namespace, "k3-fallback-epp") is None
    obj = kube.get(*CR, namespace, "k3-fallback")
    assert obj["status"]["routing"] == {"backend": "Service", "parents": []}
    # nothing refused: every other child applied, no apply failure
    assert condition(obj, "Degraded")["reason"] == "AsExpected" and condition(obj, "Progressing")["reason"] != "ApplyFailed"

    control_plane.apply_crds([thirdparty_crd_paths()["InferencePool"]])
    wait_for(lambda: kube.get(*INFERENCE_POOL.type_meta, namespace, "k3-fallback"), 4 * PERIOD_S + 30,
             "the InferencePool once its CRD is installed")
    wait_for(lambda: backends(kube, namespace, "k3-fallback")[0][1] == "InferencePool", 30, "the route moved to the pool")
    said(kube, namespace, "k3-fallback", "RoutingReady", "False", "EndpointPickerNotReady")


def gateway(name: str, allowed: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": GATEWAY.api_version, "kind": GATEWAY.kind, "metadata": {"name": name},
            "spec": {"gatewayClassName": "example", "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": allowed}]}}


def test_a_gateway_whose_listener_does_not_admit_the_namespace_shows_in_status(operator, admin_api, kube, namespace,
                                                                              deployed):
    with fresh_namespace(admin_api, "gw") as infra:
        apply(kube, gateway("edge", {"namespaces": {"from": "Same"}}), infra)
        deployed(routed("k3-gw", {"name": "edge", "namespace": infra}))
        said(kube, namespace, "k3-gw", "GatewayReady", "False", "GatewayNotProgrammed")
        status_patch(kube, GATEWAY, infra, "edge", {"conditions": [cond("Accepted", "True", "Accepted"),
                                                                   cond("Programmed", "True", "Programmed")]})
        kube.patch_merge(*CR, namespace, "k3-gw", {"metadata": {"annotations": {"touch": "1"}}})  # Gateways are not watched
        refused = said(kube, namespace, "k3-gw", "GatewayReady", "False", "NamespaceNotAllowed")
        assert refused["message"].startswith(
            f"Gateway {infra}/edge: no listener admits routes from namespace {namespace}: http (from: Same); the "
            "Gateway ignores the route and answers 404 to its requests")
        kube.patch_merge(*GATEWAY.type_meta, infra, "edge", {"spec": {"listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}})
        kube.patch_merge(*CR, namespace, "k3-gw", {"metadata": {"annotations": {"touch": "2"}}})
        accepted = said(kube, namespace, "k3-gw", "GatewayReady", "True", "GatewayAccepts")
        assert accepted["message"] == f"Gateway {infra}/edge Programmed, a listener admits namespace {namespace}"
