"""Why requests do or do not reach the groups through the gateway: RoutingReady, GatewayReady and
``status.routing``, from what one reconcile read (pure functions, no API calls).

- ``RoutingReady`` (``spec.routing.enabled``): False ``InferencePoolNotServed`` when the API server
  does not serve InferencePool (the route then goes to the Service: nothing is refused, the
  requests are spread per connection instead of by prefix and load); False
  ``EndpointPickerNotReady`` while the picker's Deployment has no available replica (what the
  gateway does meanwhile is the pool's failure mode; a missing InferenceObjective CRD, without
  which the picker cannot start, is named); False ``PoolNotAccepted`` when a gateway
  wrote a False ``Accepted`` or ``ResolvedRefs`` on the pool (its message quoted); else True.
- ``GatewayReady`` (``spec.service.httpRoute``): each Gateway the route names is read; False
  ``GatewayNotFound``, ``GatewayNotProgrammed`` (its ``Programmed`` condition not True), or
  ``NamespaceNotAllowed``: no listener (the one ``sectionName`` names, else any) admits routes
  from the deployment's namespace by its ``allowedRoutes``. That last one is the "silent 404":
  the route exists, the Gateway runs, and every request answers 404 because the Gateway ignores
  the route. ``allowedRoutes.namespaces.from: Selector`` is not evaluated (it needs the
  namespace's labels, which a namespace-scoped operator may not read): such a listener counts
  as admitting, and the message says so. Unknown ``GatewayUnreadable`` when the operator may
  not read the Gateway.
- ``status.routing``: the backend the route uses and the pool's ``status.parents`` as the
  gateways wrote them; once routing is turned off, the Service as the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimik3.api.conditions import Reason, Verdict
from kimik3.api.v1alpha1 import (Condition, GatewayParentRef, KimiK3DeploymentSpec, PoolParentRef, PoolParentStatus,
                                 RoutingStatus)
from kimik3.kube.kinds import HTTP_ROUTE, INFERENCE_OBJECTIVE, INFERENCE_POOL
from kimik3.kube.objects import condition
from kimik3.render.meta import Owner
from kimik3.render.routing import picker_name

POLL_S = 30.0
"""Look again this often while a Gateway does not admit the route (Gateways are not watched), seconds."""
REFUSING = ("Accepted", "ResolvedRefs")
"""Conditions a gateway writes on an InferencePool's parent entry that, False, mean it sends no traffic to it."""


@dataclass(frozen=True)
class GatewayRead:
    """One Gateway the route names, as read: the object, None when it does not exist, or why it
    could not be read (``refused``)."""

    ref: GatewayParentRef
    namespace: str
    """The Gateway's namespace (the ref's, else the deployment's)."""
    obj: dict[str, Any] | None = None
    refused: str | None = None


def routing_verdict(spec: KimiK3DeploymentSpec, owner: Owner, pools_served: bool, picker: dict[str, Any] | None,
                    pool: dict[str, Any] | None, objectives_served: bool = True) -> Verdict | None:
    """RoutingReady (module docstring); None with routing off. ``picker`` is the picker's Deployment
    and ``pool`` the InferencePool as read after the applies (None when absent); ``objectives_served``:
    whether the API server serves InferenceObjective, without which the picker v1.2.1 exits at start
    (its manager caches them: "no matches for kind InferenceObjective")."""
    if not spec.routing.enabled:
        return None
    if not pools_served:
        return Verdict("False", Reason.INFERENCE_POOL_NOT_SERVED, (
            f"the API server does not serve {INFERENCE_POOL.api_version} {INFERENCE_POOL.kind}: requests go to Service "
            f"{owner.name} (spread per connection, not by prefix and load); install the Gateway API Inference "
            "Extension's CRDs (v1.2.1) and the InferencePool and its endpoint picker are created"))
    name = picker_name(owner)
    available = int(((picker or {}).get("status") or {}).get("availableReplicas") or 0)
    if available < 1:
        mode = spec.routing.endpoint_picker.failure_mode
        effect = ("the gateway sends requests to leaders of its own choosing (FailOpen)" if mode == "FailOpen"
                  else "the gateway refuses requests (FailClose)")
        why = "not created yet" if picker is None else _deployment_problem(picker)
        crd = ("" if objectives_served else f"; the API server does not serve {INFERENCE_OBJECTIVE.api_version} "
               f"{INFERENCE_OBJECTIVE.kind}, without which the picker exits at start: install the Gateway API "
               "Inference Extension's CRDs (v1.2.1)")
        return Verdict("False", Reason.ENDPOINT_PICKER_NOT_READY,
                       f"endpoint picker Deployment {name} has no available replica ({why}): meanwhile {effect}{crd}")
    for parent in parents(pool):
        for c in parent.conditions:
            if c.type in REFUSING and c.status == "False":
                return Verdict("False", Reason.POOL_NOT_ACCEPTED, (
                    f"Gateway {parent.parent_ref.namespace or owner.namespace}/{parent.parent_ref.name} "
                    f"({parent.controller_name or 'its controller'}): InferencePool {owner.name} {c.type}=False "
                    f"{c.reason}: {c.message}"))
    return Verdict("True", Reason.ROUTED, f"InferencePool {owner.name} scored by endpoint picker {name} "
                   f"(failure mode {spec.routing.endpoint_picker.failure_mode})")


def _deployment_problem(deployment: dict[str, Any]) -> str:
    """What the Deployment's conditions say is wrong (ReplicaFailure True, Progressing or Available
    False: e.g. a quota refusing the pod), else its replica counts."""
    for type_ in ("ReplicaFailure", "Progressing", "Available"):
        c = condition(deployment, type_)
        if c is not None and (c.get("status") == "True") == (type_ == "ReplicaFailure"):
            return f"{type_}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
    status = deployment.get("status") or {}
    return f"{int(status.get('readyReplicas') or 0)} of {int(status.get('replicas') or 0)} replicas ready"


def parents(pool: dict[str, Any] | None) -> list[PoolParentStatus]:
    """The pool's ``status.parents`` as the gateways wrote them."""
    out = []
    for entry in ((pool or {}).get("status") or {}).get("parents") or []:
        ref = entry.get("parentRef") or {}
        out.append(PoolParentStatus(
            parent_ref=PoolParentRef(group=ref.get("group"), kind=ref.get("kind"), name=ref.get("name", ""),
                                     namespace=ref.get("namespace")),
            controller_name=entry.get("controllerName"),
            conditions=[Condition(type=c["type"], status=c["status"], reason=c.get("reason", ""),
                                  message=c.get("message", ""), last_transition_time=c.get("lastTransitionTime", ""),
                                  observed_generation=c.get("observedGeneration"))
                        for c in entry.get("conditions") or []]))
    return out


def routing_status(spec: KimiK3DeploymentSpec, owner: Owner, pools_served: bool, pool: dict[str, Any] | None,
                   reported: bool = False) -> RoutingStatus | None:
    """``status.routing``; with routing off None (left out of the status), unless the status still
    holds one (``reported``: routing was just turned off), which then says the Service is the backend."""
    if not spec.routing.enabled:
        return RoutingStatus(backend="Service") if reported else None
    if not pools_served:
        return RoutingStatus(backend="Service")
    return RoutingStatus(backend="InferencePool", inference_pool=owner.name, endpoint_picker=picker_name(owner),
                         parents=parents(pool))


def gateway_verdict(namespace: str, reads: list[GatewayRead]) -> Verdict | None:
    """GatewayReady of the route in ``namespace`` from its Gateways as read (module docstring); None
    without a route. The first Gateway that does not admit the route is named."""
    if not reads:
        return None
    unreadable, notes = None, []
    for read in reads:
        where = f"Gateway {read.namespace}/{read.ref.name}"
        if read.refused is not None:
            unreadable = unreadable or Verdict("Unknown", Reason.GATEWAY_UNREADABLE,
                                               f"{where} cannot be read: {read.refused}")
            continue
        if read.obj is None:
            return Verdict("False", Reason.GATEWAY_NOT_FOUND, (
                f"{where} does not exist (or the Gateway API CRDs are not installed): the HTTPRoute attaches to nothing; "
                "create it or change spec.service.httpRoute.parentRefs"))
        programmed = condition(read.obj, "Programmed")
        if programmed is None or programmed.get("status") != "True":
            said = (f"{programmed.get('reason', '')}: {programmed.get('message', '')}" if programmed
                    else "no Programmed condition: no controller has taken it (is its GatewayClass's controller running?)")
            return Verdict("False", Reason.GATEWAY_NOT_PROGRAMMED, f"{where} is not Programmed ({said})")
        admitted, note = admits(read, namespace)
        if not admitted:
            return Verdict("False", Reason.NAMESPACE_NOT_ALLOWED, (
                f"{where}: {note}; the Gateway ignores the route and answers 404 to its requests. Allow namespace "
                f"{namespace} in the listener's allowedRoutes.namespaces (from: All, or a Selector matching it) or "
                "name a listener that does"))
        if note:
            notes.append(f"{where}: {note}")
    if unreadable is not None:
        return unreadable
    names = ", ".join(f"{r.namespace}/{r.ref.name}" for r in reads)
    return Verdict("True", Reason.GATEWAY_ACCEPTS, f"Gateway {names} Programmed, a listener admits namespace {namespace}"
                   + "".join(f"; {n}" for n in notes))


def admits(read: GatewayRead, namespace: str) -> tuple[bool, str]:
    """Whether a listener of the Gateway (``sectionName``'s, else any) admits an HTTPRoute from
    ``namespace`` (Gateway API ``allowedRoutes``: ``namespaces.from`` Same by default, ``kinds``),
    and a note: why none does, or that a Selector was not evaluated."""
    listeners = ((read.obj or {}).get("spec") or {}).get("listeners") or []
    section = read.ref.section_name
    if section:
        listeners = [lst for lst in listeners if lst.get("name") == section]
        if not listeners:
            return False, f"it has no listener named {section}"
    refused, selector = [], []
    for listener in listeners:
        allowed = listener.get("allowedRoutes") or {}
        kinds = allowed.get("kinds") or []
        if kinds and not any(k.get("kind") == HTTP_ROUTE.kind and k.get("group", HTTP_ROUTE.group) == HTTP_ROUTE.group
                             for k in kinds):
            refused.append(f"{listener.get('name')} (kinds {', '.join(k.get('kind', '') for k in kinds)})")
            continue
        source = (allowed.get("namespaces") or {}).get("from", "Same")
        if source == "All" or source == "Same" and read.namespace == namespace:
            return True, ""
        if source == "Selector":
            selector.append(str(listener.get("name")))
            continue
        refused.append(f"{listener.get('name')} (from: {source})")
    if selector:
        return True, f"listener {', '.join(selector)} admits namespaces by a Selector, not checked by the operator"
    return False, f"no listener admits routes from namespace {namespace}: {', '.join(refused) or 'it has no listener'}"
