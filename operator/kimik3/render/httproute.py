"""The HTTPRoute (Gateway API, gateway.networking.k8s.io/v1) that exposes the deployment through a
Gateway the platform owns ("dedicated inference" behind a provider's gateway): to the client
Service, or with ``spec.routing`` to the InferencePool (``render.routing``), whose endpoint picker
then chooses the group leader of each request.

Only ``spec.service.httpRoute.pathPrefixes`` (default ``/v1``) are routed: vLLM checks its API key
(``spec.service.apiKeySecret``) on ``/v1`` only and serves ``/health``, ``/metrics``, ``/tokenize``,
``/pause`` and others without it, so those stay inside the cluster.

While the deployment sleeps (``render.wake``), the rule goes to the operator's wake Service instead.
"""

from __future__ import annotations

from typing import Any

from kimik3.kube.kinds import HTTP_ROUTE, INFERENCE_POOL, SERVICE
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.render.meta import Owner
from kimik3.render.wake import WakeEndpoint, wake_rule


def http_route(owner: Owner, spec: KimiK3DeploymentSpec, to_pool: bool = False,
               wake: WakeEndpoint | None = None) -> dict[str, Any]:
    """The route of ``spec.service.httpRoute`` to the client Service, or with ``to_pool`` to the
    InferencePool (both named like the deployment; a pool's backendRef has no port: the pool's
    targetPorts say it), or with ``wake`` to the operator's wake Service (``render.wake.wake_rule``)."""
    route = spec.service.http_route
    if route is None:
        raise ValueError("spec.service.httpRoute is not set")
    parents = []
    for ref in route.parent_refs:
        parent: dict[str, Any] = {"group": HTTP_ROUTE.group, "kind": "Gateway", "name": ref.name}
        if ref.namespace:
            parent["namespace"] = ref.namespace
        if ref.section_name:
            parent["sectionName"] = ref.section_name
        parents.append(parent)
    route_spec: dict[str, Any] = {"parentRefs": parents}
    if route.hostnames:
        route_spec["hostnames"] = list(route.hostnames)
    matches = [{"path": {"type": "PathPrefix", "value": prefix}} for prefix in route.path_prefixes]
    if wake is not None:
        route_spec["rules"] = [{"matches": matches, **wake_rule(wake, owner.namespace, owner.name, owner.uid)}]
    else:
        route_spec["rules"] = [{"matches": matches, "backendRefs": [
            {"group": INFERENCE_POOL.group, "kind": INFERENCE_POOL.kind, "name": owner.name} if to_pool
            else {"group": SERVICE.group, "kind": SERVICE.kind, "name": owner.name, "port": spec.service.port}]}]
    return {"apiVersion": HTTP_ROUTE.api_version, "kind": HTTP_ROUTE.kind, "metadata": owner.metadata(owner.name),
            "spec": route_spec}
