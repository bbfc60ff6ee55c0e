"""Placement kueue: a group whose tray failed is admitted again by Kueue, whole, into one rack.

Seen on the dev cluster (bench/soak.py, tray faults; Kueue v0.17.0, kubernetes-sigs/kueue#6957).
When a tray of an admitted group fails, Kueue's node controller lists it in the Workload's
``status.unhealthyNodes`` (at once when no pod of the group still runs there, feature gate
``TASReplaceNodeOnPodTermination``; else after ``NodeFailureDelay``, 30 s), and its scheduler looks
for a replacement node for that pod set alone (``TASFailedNodeReplacement``):
- a TP8 group's worker pod set has one pod, so the replacement is bound to no domain
  (``requiredReplacementDomain`` in ``pkg/cache/scheduler/tas_flavor_snapshot.go``) and may land in
  another rack than the leader: the group spans two NVLink domains and cannot run;
- for the leader the replacement may find nothing, and the recreated pods stay gated until the
  tray is back.
Toggling ``spec.active`` does not help: Kueue's Workload controller skips an admitted Workload that
lists unhealthy nodes (``workload_controller.go``: "Skipping reconcile of a workload with nodes to
replace"), so the deactivation is not acted on, and a Workload activated again was seen re-admitted
in a loop the API server refused (``topologyAssignment.slices: Required value``).

The repair: delete the group's Workload (its UID as precondition, so that a fresh one is never hit).
Kueue then deletes the group's pods (``StopReasonWorkloadDeleted``), drops the Workload's finalizer,
and its LeaderWorkerSet reconciler creates a fresh Workload of the same name for the group, which
Kueue admits from scratch, whole, into a rack with room (TAS counts only Ready trays). Pure
decisions here; the reconciler deletes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3.kube import pods as kpods
from kimik3.kube import workloads as kworkloads
from kimik3.kube.objects import field


@dataclass(frozen=True)
class Readmit:
    """A group's Workload to delete, for Kueue to admit the group again from scratch."""

    workload: str
    """Its name."""
    uid: str
    """Its UID (the delete's precondition)."""
    event: tuple[str, str, str]
    """Event (type, reason, message) on the CR."""


def split_racks(pods: list[dict[str, Any]], racks: Mapping[str, str]) -> dict[str, list[str]]:
    """``{group index: its racks}`` for the groups whose live bound pods are in more than one rack."""
    seen: dict[str, set[str]] = {}
    for pod in pods:
        node = kpods.node_name(pod)
        if node in racks and not kpods.is_terminating(pod):
            seen.setdefault(kpods.group_index(pod) or "?", set()).add(racks[node])
    return {g: sorted(r) for g, r in seen.items() if len(r) > 1}


def unhealthy_nodes(workload: dict[str, Any]) -> list[str]:
    """The trays Kueue lists as failed under this Workload (``status.unhealthyNodes[*].name``)."""
    return [n["name"] for n in field(workload.get("status"), "unhealthyNodes") or [] if field(n, "name")]


def readmissions(workloads: list[dict[str, Any]], pods: list[dict[str, Any]],
                 racks: Mapping[str, str]) -> list[Readmit]:
    """The admitted Workloads to delete: those whose group is split across racks, and those that
    list a failed tray (Kueue would replace it for one pod set alone, or not at all)."""
    split = split_racks(pods, racks)
    out = []
    for w in workloads:
        meta = w.get("metadata") or {}
        if not kworkloads.is_admitted(w) or meta.get("deletionTimestamp"):
            continue
        group, failed = kworkloads.group_index(w), unhealthy_nodes(w)
        if group in split:
            reason, why = "GroupSplitAcrossRacks", (f"Kueue placed its pods in racks {' and '.join(split[group])} "
                                                    "(its node replacement after a tray failed, kueue#6957)")
        elif failed:
            reason, why = "GroupTrayFailed", (f"its tray {', '.join(failed)} failed (Kueue lists it unhealthy; its "
                                              "replacement moves one pod set alone, kueue#6957)")
        else:
            continue
        out.append(Readmit(meta["name"], meta.get("uid", ""), (
            "Warning", reason, f"group {group}: {why}; deleting the group's Workload so that Kueue admits the "
                               "group again whole, into one rack with room")))
    return out


def awaits_kueue(workloads: list[dict[str, Any]], pods: list[dict[str, Any]]) -> bool:
    """Some group has an admitted Workload but a live pod not bound to a tray (gated or Pending): Kueue
    may be replacing a failed tray, which the reconciler then checks again soon (Workloads are
    not watched)."""
    admitted = {kworkloads.group_index(w) for w in workloads if kworkloads.is_admitted(w)}
    return any(kpods.group_index(p) in admitted and not kpods.node_name(p) and not kpods.is_terminating(p)
               for p in pods)
