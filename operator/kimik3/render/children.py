"""All children of one KimiK3Deployment, in apply order.

``render(admitted, owner)`` takes the admitted spec (``kimik3.admission.admit``) and the custom
resource's identity and returns a ``Rendered``: the objects to apply (ComputeDomain, launcher
ConfigMap, LeaderWorkerSet, Service, PodDisruptionBudget, PodMonitor, with ``spec.routing`` the
endpoint picker and the InferencePool, HTTPRoute), the children that must not exist (e.g. the
budget at one replica, the ComputeDomain at zero replicas, the picker with routing off), and
warnings for the user, each with the reason of the Event that says it. It refuses nothing:
admission did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kimik3.admission import Admitted
from kimik3.api.conditions import Event, EventReason
from kimik3.engine.overrides import describe
from kimik3.kube.kinds import COMPUTE_DOMAIN, HTTP_ROUTE, INFERENCE_POOL, POD_DISRUPTION_BUDGET, POD_MONITOR, Kind, kind_of
from kimik3.render.computedomain import compute_domain
from kimik3.render.configmap import launcher_configmap
from kimik3.render.disruption import disruption_budget
from kimik3.render.httproute import http_route
from kimik3.render.leaderworkerset import leader_worker_set
from kimik3.render.meta import Owner
from kimik3.render.podmonitor import pod_monitor
from kimik3.render.routing import endpoint_picker, inference_pool
from kimik3.render.wake import WakeEndpoint
from kimik3.render.service import client_service


class Absent(NamedTuple):
    """A child that must not exist now: of ``kind``, named ``name`` in the deployment's namespace."""

    kind: Kind
    name: str


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    """Children to apply, in order (the ComputeDomain before the pods that claim it)."""
    absent: list[Absent] = field(default_factory=list)
    """Children that must not exist now."""
    warnings: list[Event] = field(default_factory=list)
    """Warning Events for the user (posted on the CR; printed by ``kimik3 render``)."""


COMPUTE_DOMAIN_SKIPPED = ("no ComputeDomain: the operator runs with --no-compute-domains (a cluster without "
                          "NVIDIA's DRA driver, such as `kimik3 dev up`); on real NVL72 trays this group's "
                          "multi-node NVLink needs one")


def render(admitted: Admitted, owner: Owner, replicas: int | None = None, compute_domains: bool = True,
           start_delay_s: float = 0.0, inference_pools: bool = True, wake: WakeEndpoint | None = None) -> Rendered:
    """Children of the deployment ``owner`` names; ``replicas`` overrides spec.replicas (the
    autoscaler's choice); ``compute_domains=False`` renders no ComputeDomain and no channel claims
    (clusters without the DRA driver) and says so in ``warnings``; ``start_delay_s`` is the
    launcher's start back-off (seconds; kimik3.controller.recreation); ``inference_pools=False``
    (a cluster that does not serve InferencePool) renders ``spec.routing`` as the Service path:
    no pool, no picker, the HTTPRoute to the Service (the RoutingReady condition says so); ``wake``:
    the HTTPRoute goes to the operator's wake Service instead (the deployment sleeps, ``render.wake``)."""
    spec, plan = admitted.spec, admitted.plan
    groups = spec.replicas if replicas is None else replicas
    objects: list[dict[str, Any]] = []
    absent: list[Absent] = []
    warnings: list[Event] = []
    cd = compute_domain(owner)
    with_cd = plan.needs_compute_domain and compute_domains
    if plan.needs_compute_domain and not compute_domains:
        warnings.append(Event("Warning", EventReason.COMPUTE_DOMAIN_SKIPPED, COMPUTE_DOMAIN_SKIPPED))
    if with_cd and groups > 0:
        objects.append(cd)
    else:  # also when a spec change moved the deployment to nodes that need none
        absent.append(Absent(COMPUTE_DOMAIN, owner.name))
    objects.append(launcher_configmap(owner, admitted, start_delay_s))
    objects.append(leader_worker_set(owner, admitted, groups, channel_claims=with_cd))
    objects.append(client_service(owner, spec))
    pdb, why = disruption_budget(owner, spec, plan, groups)
    if pdb is not None:
        objects.append(pdb)
    else:
        absent.append(Absent(POD_DISRUPTION_BUDGET, owner.name))
        if why:
            warnings.append(Event("Warning", EventReason.DISRUPTION_BUDGET_SKIPPED, why))
    warnings += [Event("Warning", EventReason.ENGINE_SETTING_OVERRIDDEN, describe(o)) for o in admitted.overrides]
    if spec.monitoring.enabled:
        objects.append(pod_monitor(owner, spec))
    else:
        absent.append(Absent(POD_MONITOR, owner.name))
    routing = [*endpoint_picker(owner, spec), inference_pool(owner, spec)]
    to_pool = spec.routing.enabled and inference_pools
    if to_pool:
        objects += routing
    else:  # routing off, or the Service path: none of it (the pool's kind may not even be served)
        absent += [Absent(kind_of(o["apiVersion"], o["kind"]), o["metadata"]["name"]) for o in routing
                   if inference_pools or o["kind"] != INFERENCE_POOL.kind]
    if spec.service.http_route is not None:
        objects.append(http_route(owner, spec, to_pool, wake))
    else:
        absent.append(Absent(HTTP_ROUTE, owner.name))
    return Rendered(objects, absent, warnings)
