"""All children of one KimiK3Deployment, in apply order.

``render(admitted, owner)`` takes the admitted spec (``kimik3.admission.admit``) and the custom
resource's identity and returns a ``Rendered``: the objects to apply (ComputeDomain, launcher
ConfigMap, LeaderWorkerSet, Service, PodDisruptionBudget, PodMonitor, HTTPRoute), the kinds that
must not exist (e.g. the budget at one replica, the ComputeDomain at zero replicas), and warnings
for the user, each with the reason of the Event that says it. It refuses nothing: admission did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import Event, EventReason
from kimik3.engine.overrides import describe
from kimik3.kube.kinds import COMPUTE_DOMAIN, HTTP_ROUTE, POD_DISRUPTION_BUDGET, POD_MONITOR, Kind
from kimik3.render.computedomain import compute_domain
from kimik3.render.configmap import launcher_configmap
from kimik3.render.disruption import disruption_budget
from kimik3.render.httproute import http_route
from kimik3.render.leaderworkerset import leader_worker_set
from kimik3.render.meta import Owner
from kimik3.render.podmonitor import pod_monitor
from kimik3.render.service import client_service


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    """Children to apply, in order (the ComputeDomain before the pods that claim it)."""
    absent: list[Kind] = field(default_factory=list)
    """Kinds of the children (named like the deployment) that must not exist now."""
    warnings: list[Event] = field(default_factory=list)
    """Warning Events for the user (posted on the CR; printed by ``kimik3 render``)."""


COMPUTE_DOMAIN_SKIPPED = ("no ComputeDomain: the operator runs with --no-compute-domains (a cluster without "
                          "NVIDIA's DRA driver, such as `kimik3 dev up`); on real NVL72 trays this group's "
                          "multi-node NVLink needs one")


def render(admitted: Admitted, owner: Owner, replicas: int | None = None, compute_domains: bool = True,
           start_delay_s: float = 0.0) -> Rendered:
    """Children of the deployment ``owner`` names; ``replicas`` overrides spec.replicas (the
    autoscaler's choice); ``compute_domains=False`` renders no ComputeDomain and no channel claims
    (clusters without the DRA driver) and says so in ``warnings``; ``start_delay_s`` is the
    launcher's start back-off (seconds; kimik3.controller.recreation)."""
    spec, plan = admitted.spec, admitted.plan
    groups = spec.replicas if replicas is None else replicas
    objects: list[dict[str, Any]] = []
    absent: list[Kind] = []
    warnings: list[Event] = []
    cd = compute_domain(owner)
    with_cd = plan.needs_compute_domain and compute_domains
    if plan.needs_compute_domain and not compute_domains:
        warnings.append(Event("Warning", EventReason.COMPUTE_DOMAIN_SKIPPED, COMPUTE_DOMAIN_SKIPPED))
    if with_cd and groups > 0:
        objects.append(cd)
    else:  # also when a spec change moved the deployment to nodes that need none
        absent.append(COMPUTE_DOMAIN)
    objects.append(launcher_configmap(owner, admitted, start_delay_s))
    objects.append(leader_worker_set(owner, admitted, groups, channel_claims=with_cd))
    objects.append(client_service(owner, spec))
    pdb, why = disruption_budget(owner, spec, plan, groups)
    if pdb is not None:
        objects.append(pdb)
    else:
        absent.append(POD_DISRUPTION_BUDGET)
        if why:
            warnings.append(Event("Warning", EventReason.DISRUPTION_BUDGET_SKIPPED, why))
    warnings += [Event("Warning", EventReason.ENGINE_SETTING_OVERRIDDEN, describe(o)) for o in admitted.overrides]
    if spec.monitoring.enabled:
        objects.append(pod_monitor(owner, spec))
    else:
        absent.append(POD_MONITOR)
    if spec.service.http_route is not None:
        objects.append(http_route(owner, spec))
    else:
        absent.append(HTTP_ROUTE)
    return Rendered(objects, absent, warnings)
