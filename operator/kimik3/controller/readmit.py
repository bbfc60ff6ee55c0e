"""Placement kueue: a group Kueue split across racks is evicted and admitted again whole.

Seen on the dev cluster (bench/soak.py, tray faults; Kueue v0.17.0, kubernetes-sigs/kueue#6957):
when the tray of a group's worker fails, Kueue's failed-node replacement (feature gate
``TASFailedNodeReplacement``, on by default) looks for a new node for that pod set alone. A TP8
group's worker pod set has one pod, so the replacement is bound to no domain
(``requiredReplacementDomain`` in ``pkg/cache/scheduler/tas_flavor_snapshot.go``: "the faulty
node was the only one in the assignment") and may land in another rack than its leader: the group
spans two NVLink domains and cannot run. Kueue never corrects it.

The repair, tried by hand on the dev cluster first: deactivate the group's Workload
(``spec.active: false``; Kueue evicts it, reason ``Deactivated``, and its pods come back gated),
then, once Kueue has evicted it (``Evicted=True``) and released its quota and rack
(``QuotaReserved`` no longer True), and no pod of the group holds a tray any more, activate it
again: Kueue admits the group whole, into one rack, as for a new group. Activated earlier, while
Kueue still clears the old admission, its scheduler writes an admission the API server refuses
(``topologyAssignment.slices: Required value``) and retries in a loop until the failed tray is
back (seen in the soak). The operator marks the Workloads it deactivated (``READMIT_ANNOTATION``)
and reactivates only those. Pure decisions here; the reconciler makes the patches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3.kube import pods as kpods
from kimik3.kube import workloads as kworkloads
from kimik3.kube.kinds import GROUP
from kimik3.kube.objects import field, is_true

READMIT_ANNOTATION = f"{GROUP}/readmit"
"""On a Workload the operator deactivated: the racks its group was split over."""


@dataclass(frozen=True)
class Readmit:
    """One patch of a group's Workload."""

    workload: str
    """Its name."""
    patch: dict[str, Any]
    """JSON merge patch of the Workload."""
    event: tuple[str, str, str] | None
    """Event (type, reason, message) on the CR, or None."""


def is_readmitting(workload: dict[str, Any]) -> bool:
    """The operator deactivated this Workload and has not activated it again yet."""
    meta = workload.get("metadata") or {}
    return bool((meta.get("annotations") or {}).get(READMIT_ANNOTATION)) and \
        field(workload.get("spec"), "active") is False


def split_racks(pods: list[dict[str, Any]], racks: Mapping[str, str]) -> dict[str, list[str]]:
    """``{group index: its racks}`` for the groups whose live bound pods are in more than one rack."""
    seen: dict[str, set[str]] = {}
    for pod in pods:
        node = kpods.node_name(pod)
        if node in racks and not kpods.is_terminating(pod):
            seen.setdefault(kpods.group_index(pod) or "?", set()).add(racks[node])
    return {g: sorted(r) for g, r in seen.items() if len(r) > 1}


def readmissions(workloads: list[dict[str, Any]], pods: list[dict[str, Any]],
                 racks: Mapping[str, str]) -> list[Readmit]:
    """Deactivate each admitted Workload whose group is split; activate each one the operator
    deactivated once Kueue has evicted it, released its admission, and its group's pods have left
    their trays."""
    split = split_racks(pods, racks)
    bound = {kpods.group_index(p) for p in pods if kpods.node_name(p)}
    out = []
    for w in workloads:
        meta = w.get("metadata") or {}
        group, marked = kworkloads.group_index(w), (meta.get("annotations") or {}).get(READMIT_ANNOTATION)
        active = field(w.get("spec"), "active") is not False
        if active and not marked and group in split and kworkloads.is_admitted(w):
            where = " and ".join(split[group])
            out.append(Readmit(meta["name"], {"metadata": {"annotations": {READMIT_ANNOTATION: where}},
                                              "spec": {"active": False}},
                               ("Warning", "GroupSplitAcrossRacks",
                                f"group {group}: Kueue placed its pods in racks {where} (its node replacement "
                                "after a tray failed, kueue#6957); evicting the group's Workload so that Kueue "
                                "admits it again whole, into one rack")))
        elif is_readmitting(w) and is_true(w, "Evicted") and not is_true(w, "QuotaReserved") and group not in bound:
            out.append(Readmit(meta["name"], {"metadata": {"annotations": {READMIT_ANNOTATION: None}},
                                              "spec": {"active": True}}, None))
    return out
