"""The HTTPRoute (Gateway API, gateway.networking.k8s.io/v1) that exposes the client Service
through a Gateway the platform owns ("dedicated inference" behind a provider's gateway).

Only ``spec.service.httpRoute.pathPrefixes`` (default ``/v1``) are routed: vLLM checks its API key
(``spec.service.apiKeySecret``) on ``/v1`` only and serves ``/health``, ``/metrics``, ``/tokenize``,
``/pause`` and others without it, so those stay inside the cluster.
"""

from __future__ import annotations

from typing import Any

from kimik3.kube.kinds import HTTP_ROUTE, SERVICE
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.render.meta import Owner



def http_route(owner: Owner, spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    """The route of ``spec.service.httpRoute`` to the client Service (named like the deployment)."""
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
    route_spec["rules"] = [{
        "matches": [{"path": {"type": "PathPrefix", "value": prefix}} for prefix in route.path_prefixes],
        "backendRefs": [{"group": SERVICE.group, "kind": SERVICE.kind, "name": owner.name,
                         "port": spec.service.port}],
    }]
    return {"apiVersion": HTTP_ROUTE.api_version, "kind": HTTP_ROUTE.kind, "metadata": owner.metadata(owner.name),
            "spec": route_spec}
