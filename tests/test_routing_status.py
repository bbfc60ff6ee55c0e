"""RoutingReady from what the reconcile read (``kimik3.controller.routing.routing_verdict``), and
GatewayReady from the Gateways as read (``kimik3.controller.routing.gateway_verdict``): which
listener admits an HTTPRoute from the deployment's namespace (Gateway API allowedRoutes: namespaces
from Same by default, All, Selector; kinds), a sectionName narrowing it to one listener, and what a
Gateway that cannot be read says. The API-server side is tests/test_routing_operator.py."""

from __future__ import annotations

from typing import Any

import pytest

from kimik3.admission import admit
from kimik3.api.v1alpha1 import GatewayParentRef
from kimik3.controller.routing import GatewayRead, gateway_verdict, routing_verdict
from kimik3.render.meta import Owner
from support.recipes import recipe

NS = "serving"
PROGRAMMED = {"conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed"}]}


def read(listeners: list[dict[str, Any]], namespace: str = "infra", section: str | None = None,
         status: dict[str, Any] | None = None) -> GatewayRead:
    obj = {"spec": {"listeners": listeners}, "status": PROGRAMMED if status is None else status}
    return GatewayRead(GatewayParentRef(name="edge", section_name=section), namespace, obj)


def listener(name: str, **allowed: Any) -> dict[str, Any]:
    return {"name": name, "port": 80, "protocol": "HTTP", "allowedRoutes": allowed}


@pytest.mark.parametrize("listeners, namespace, section, reason", [
    ([listener("http")], NS, None, "GatewayAccepts"),                                  # Same, same namespace
    ([listener("http")], "infra", None, "NamespaceNotAllowed"),                        # Same by default
    ([listener("http", namespaces={"from": "All"})], "infra", None, "GatewayAccepts"),
    ([listener("a"), listener("b", namespaces={"from": "All"})], "infra", None, "GatewayAccepts"),
    ([listener("a"), listener("b", namespaces={"from": "All"})], "infra", "a", "NamespaceNotAllowed"),
    ([listener("b", namespaces={"from": "All"})], "infra", "missing", "NamespaceNotAllowed"),
    ([listener("grpc", namespaces={"from": "All"}, kinds=[{"kind": "GRPCRoute"}])], "infra", None,
     "NamespaceNotAllowed"),
    ([listener("http", namespaces={"from": "All"}, kinds=[{"kind": "HTTPRoute"}])], "infra", None, "GatewayAccepts"),
], ids=["same-ns", "same-other-ns", "all", "one-of-two", "section-refuses", "no-such-section", "kinds-refuse",
        "kinds-admit"])
def test_which_listener_admits_the_route(listeners, namespace, section, reason):
    verdict = gateway_verdict(NS, [read(listeners, namespace, section)])
    assert verdict is not None and verdict.reason == reason
    assert verdict.status == ("True" if reason == "GatewayAccepts" else "False")


def test_the_refusal_names_each_listener_and_the_fix():
    verdict = gateway_verdict(NS, [read([listener("http"), listener("grpc", namespaces={"from": "All"},
                                                                     kinds=[{"kind": "GRPCRoute"}])])])
    assert verdict is not None
    assert verdict.message.startswith("Gateway infra/edge: no listener admits routes from namespace serving: "
                                      "http (from: Same), grpc (kinds GRPCRoute); the Gateway ignores the route")
    assert "allowedRoutes.namespaces" in verdict.message


def test_a_selector_is_not_evaluated_and_said_so():
    verdict = gateway_verdict(NS, [read([listener("http", namespaces={"from": "Selector", "selector": {
        "matchLabels": {"gateway-access": "yes"}}})])])
    assert verdict is not None and verdict.reason == "GatewayAccepts"
    assert "listener http admits namespaces by a Selector, not checked by the operator" in verdict.message


def test_missing_unprogrammed_and_unreadable_gateways():
    ref = GatewayParentRef(name="edge")
    missing = gateway_verdict(NS, [GatewayRead(ref, NS, None)])
    assert missing is not None and (missing.status, missing.reason) == ("False", "GatewayNotFound")
    waiting = gateway_verdict(NS, [read([listener("http")], NS, status={"conditions": [
        {"type": "Programmed", "status": "False", "reason": "AddressNotAssigned", "message": "no address yet"}]})])
    assert waiting is not None and waiting.reason == "GatewayNotProgrammed"
    assert waiting.message == "Gateway serving/edge is not Programmed (AddressNotAssigned: no address yet)"
    unclaimed = gateway_verdict(NS, [read([listener("http")], NS, status={})])
    assert unclaimed is not None and "no controller has taken it" in unclaimed.message
    refused = gateway_verdict(NS, [GatewayRead(ref, "infra", refused="403 Forbidden: no")])
    assert refused is not None and (refused.status, refused.reason) == ("Unknown", "GatewayUnreadable")
    # a Gateway that refuses outranks one that cannot be read
    both = gateway_verdict(NS, [GatewayRead(ref, "infra", refused="403 Forbidden: no"), GatewayRead(ref, NS, None)])
    assert both is not None and both.reason == "GatewayNotFound"
    assert gateway_verdict(NS, []) is None


def test_routing_ready_from_the_pool_kind_the_picker_and_the_gateways():
    owner = Owner("k3", NS, "uid")
    spec = admit(recipe(routing={"enabled": True, "endpointPicker": {"failureMode": "FailClose"}})["spec"]).spec
    assert routing_verdict(admit(recipe()["spec"]).spec, owner, True, None, None) is None  # routing off
    fallback = routing_verdict(spec, owner, False, None, None)
    assert fallback is not None and (fallback.status, fallback.reason) == ("False", "InferencePoolNotServed")
    starting = routing_verdict(spec, owner, True, {"status": {"conditions": [
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable", "message": "0 available"}]}},
        None)
    assert starting is not None and starting.reason == "EndpointPickerNotReady"
    assert starting.message == ("endpoint picker Deployment k3-epp has no available replica (Available=False "
                                "MinimumReplicasUnavailable: 0 available): meanwhile the gateway refuses requests "
                                "(FailClose)")
    no_crd = routing_verdict(spec, owner, True, None, None, objectives_served=False)
    assert no_crd is not None and no_crd.message.endswith(
        "the API server does not serve inference.networking.x-k8s.io/v1alpha2 InferenceObjective, without which the "
        "picker exits at start: install the Gateway API Inference Extension's CRDs (v1.2.1)")
    available = {"status": {"availableReplicas": 1}}
    routed = routing_verdict(spec, owner, True, available, {"status": {"parents": [{
        "parentRef": {"name": "edge"}, "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}]}]}})
    assert routed is not None and (routed.status, routed.reason) == ("True", "Routed")
    refused = routing_verdict(spec, owner, True, available, {"status": {"parents": [{
        "parentRef": {"name": "edge"}, "conditions": [
            {"type": "Accepted", "status": "False", "reason": "NotAllowedByListeners", "message": "no"}]}]}})
    assert refused is not None and refused.reason == "PoolNotAccepted"
    assert refused.message == ("Gateway serving/edge (its controller): InferencePool k3 Accepted=False "
                               "NotAllowedByListeners: no")
