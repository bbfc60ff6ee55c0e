"""The gateway wake: where a stopped deployment's HTTPRoute sends its requests (spec.idle.stopAfter).

While no group of a deployment with ``spec.idle.stopAfter`` serves (stopped, or woken and still
loading), its HTTPRoute (``render.httproute``) points at the operator's wake endpoint instead of the
InferencePool or the Service: a Service of the operator (``WakeEndpoint``, ``kimik3 run
--wake-service``) in front of the activator the operator process serves (``controller.activator``),
which answers each request at once with 503 and ``Retry-After`` and wakes the deployment. This is
how Knative's activator and the KEDA HTTP add-on's interceptor sit in a route while a workload is
scaled to zero, expressed in Gateway API Core features only, so any conformant Gateway follows it:

- the rule's ``RequestHeaderModifier`` filter sets ``DEPLOYMENT_HEADER`` to ``<namespace>/<name>``
  and ``UID_HEADER`` to its uid (``set`` replaces what a client sent), which tell the activator
  which deployment a request is for;
- the backendRef names a Service in the operator's namespace, which Gateway API allows only with a
  ``ReferenceGrant`` there (``reference_grant``: HTTPRoutes of the tenant's namespace may name that
  one Service; Gateway API ``ReferenceGrant``, ``gateway.networking.k8s.io/v1beta1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimik3.kube.kinds import HTTP_ROUTE, REFERENCE_GRANT, SERVICE
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL

DEPLOYMENT_HEADER = "x-kimik3-deployment"
"""Request header the route's filter sets to ``<namespace>/<name>`` of the KimiK3Deployment: which
deployment the activator wakes."""
UID_HEADER = "x-kimik3-deployment-uid"
"""Request header the route's filter sets to the KimiK3Deployment's ``metadata.uid``: the activator
wakes it only if the uid matches, so a route in another namespace (which the ReferenceGrant lets
name the wake Service too) cannot wake a deployment whose uid its tenant cannot read."""
GRANT_PREFIX = "kimik3-wake-"
"""ReferenceGrants are named ``kimik3-wake-<tenant namespace>`` (one per namespace whose routes may
point at the wake Service)."""


@dataclass(frozen=True)
class WakeEndpoint:
    """The operator's wake Service: ``namespace/service:port`` (``kimik3 run --wake-service``; the chart's
    ``<release>-wake`` Service on ``wake.port``)."""

    namespace: str
    service: str
    port: int

    @classmethod
    def parse(cls, text: str) -> WakeEndpoint:
        """``NAMESPACE/SERVICE:PORT``; raises ``ValueError`` naming the expected form."""
        where, _, port = text.rpartition(":")
        namespace, _, service = where.partition("/")
        if not (namespace and service and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"wake service {text!r} is not NAMESPACE/SERVICE:PORT "
                             "(e.g. kimik3-system/kimik3-operator-wake:8081)")
        return cls(namespace, service, int(port))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service}:{self.port}"


def wake_rule(wake: WakeEndpoint, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """An HTTPRoute rule's ``filters`` and ``backendRefs`` sending to the wake Service, with the
    deployment named in ``DEPLOYMENT_HEADER`` and ``UID_HEADER`` (the caller adds the rule's ``matches``)."""
    return {
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": DEPLOYMENT_HEADER, "value": f"{namespace}/{name}"}, {"name": UID_HEADER, "value": uid}]}}],
        "backendRefs": [{"group": SERVICE.group, "kind": SERVICE.kind, "name": wake.service,
                         "namespace": wake.namespace, "port": wake.port}],
    }


def reference_grant(wake: WakeEndpoint, from_namespace: str) -> dict[str, Any]:
    """The ReferenceGrant in the wake Service's namespace that lets the HTTPRoutes of
    ``from_namespace`` name it (none needed when the namespaces are the same). Not owned by any
    deployment (an owner must be in the same namespace): it stays after the last route left it."""
    return {
        "apiVersion": REFERENCE_GRANT.api_version, "kind": REFERENCE_GRANT.kind,
        "metadata": {"name": f"{GRANT_PREFIX}{from_namespace}", "namespace": wake.namespace,
                     "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"from": [{"group": HTTP_ROUTE.group, "kind": HTTP_ROUTE.kind, "namespace": from_namespace}],
                 "to": [{"group": SERVICE.group, "kind": SERVICE.kind, "name": wake.service}]},
    }
