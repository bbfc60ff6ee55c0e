"""Placement kueue: a group whose tray failed is admitted again by Kueue, whole, into one rack.

Seen on the dev cluster (bench/soak.py, tray faults; Kueue v0.17.0, kubernetes-sigs/kueue#6957; the
replacement search below reads the same in v0.19.2).
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

The same repair frees a Workload Kueue stranded before its first admission: with ComputeDomains
its pod sets claim the channel through the ResourceClaimTemplate NVIDIA's driver creates for the
ComputeDomain, a moment after the operator applies both. Kueue (>= v0.18, DRA quota accounting)
reads that template when it first sees the Workload; when the driver has not made it yet, Kueue
marks the Workload ``Requeued=False`` ``Inadmissible`` ("failed to get claim spec for
ResourceClaimTemplate ... not found", ``pkg/dra/claims.go``) and never looks at it again (seen on
``dev up`` with Kueue v0.19.2: a high-priority group that should have preempted waited forever).
Once that verdict is ``STRANDED_AFTER_S`` old, the Workload is deleted and the fresh one is
admitted with the template in place.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimik3.api.conditions import Event, EventReason
from kimik3.kube import groups as kgroups
from kimik3.kube import pods as kpods
from kimik3.kube import workloads as kworkloads
from kimik3.kube.labels import KUEUE_JOB_UID_LABEL, LWS_NAME_LABEL
from kimik3.kube.times import parse_rfc3339

STRANDED_AFTER_S = 10.0
"""How long a Workload stays ``Inadmissible`` for a missing ResourceClaimTemplate before it is
deleted, seconds: the driver makes the template within a second or two; a cluster without the
driver (the ComputeDomainReady condition says so) sees its Workload recreated at most this often."""


@dataclass(frozen=True)
class Readmit:
    """A group's Workload to delete, for Kueue to admit the group again from scratch."""

    workload: str
    """Its name."""
    uid: str
    """Its UID (the delete's precondition)."""
    event: Event
    """The Event on the CR."""


GroupKey = tuple[str | None, str | None]
"""(LeaderWorkerSet name, group index): a group (a rollout runs two LeaderWorkerSets, each with a group 0)."""


def _pod_group(pod: dict[str, Any]) -> GroupKey:
    return kpods.labels(pod).get(LWS_NAME_LABEL), kpods.group_index(pod)


def _workload_group(workload: dict[str, Any], sets: Mapping[str, str]) -> GroupKey:
    """``sets``: LeaderWorkerSet uid -> name (a Workload names its set's uid in ``kueue.x-k8s.io/job-uid``)."""
    uid = ((workload.get("metadata") or {}).get("labels") or {}).get(KUEUE_JOB_UID_LABEL)
    return sets.get(uid or ""), kworkloads.group_index(workload)


def unhealthy_nodes(workload: dict[str, Any]) -> list[str]:
    """The trays Kueue lists as failed under this Workload (``status.unhealthyNodes[*].name``)."""
    return [n["name"] for n in (workload.get("status") or {}).get("unhealthyNodes") or [] if n.get("name")]


def stranded(workload: dict[str, Any], now: dt.datetime) -> str | None:
    """Kueue's message when it set this Workload aside for good because a ResourceClaimTemplate its
    pod sets name was not found (``Requeued=False``, reason ``Inadmissible``) at least
    ``STRANDED_AFTER_S`` before ``now``; else None."""
    for c in (workload.get("status") or {}).get("conditions") or []:
        message = c.get("message") or ""
        if (c.get("type"), c.get("status"), c.get("reason")) == ("Requeued", "False", "Inadmissible") \
                and "ResourceClaimTemplate" in message and "not found" in message:
            since = parse_rfc3339(c.get("lastTransitionTime"))
            return message if since is not None and (now - since).total_seconds() >= STRANDED_AFTER_S else None
    return None


def readmissions(workloads: list[dict[str, Any]], groups: Mapping[kgroups.GroupKey, kgroups.Group],
                 sets: Mapping[str, str], now: dt.datetime) -> list[Readmit]:
    """The Workloads to delete: admitted ones whose group is split across racks
    (``kube.groups.Group.split``: its live pods in more than one NVLink domain) or that list a
    failed tray (Kueue would replace it for one pod set alone, or not at all), and those Kueue
    stranded on a ResourceClaimTemplate not yet made (``stranded``). ``groups``: the deployment's
    groups (``kube.groups.groups_of`` with the trays' racks); ``sets``: its LeaderWorkerSets,
    uid -> name; ``now``: the time ``stranded`` measures from."""
    out = []
    for w in workloads:
        meta = w.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if not kworkloads.is_admitted(w):
            message = stranded(w, now)
            if message is not None:
                out.append(Readmit(meta["name"], meta.get("uid", ""), Event(
                    "Warning", EventReason.GROUP_PENDING,
                    f"group {kworkloads.group_index(w)}: Kueue set its Workload aside ({message}); the ComputeDomain's "
                    "channel template exists now or soon: deleting the Workload so that Kueue reads it again",
                    once=False)))
            continue
        key, failed = _workload_group(w, sets), unhealthy_nodes(w)
        group = key[1]
        found = groups.get((key[0], int(group))) if key[0] and group and group.isdigit() else None
        if found is not None and found.split:
            reason = EventReason.GROUP_SPLIT_ACROSS_RACKS
            why = (f"Kueue placed its pods in racks {' and '.join(found.racks)} (its node replacement after a tray "
                   "failed, kueue#6957)")
        elif failed:
            reason = EventReason.GROUP_TRAY_FAILED
            why = (f"its tray {', '.join(failed)} failed (Kueue lists it unhealthy; its replacement moves one pod set "
                   "alone, kueue#6957)")
        else:
            continue
        out.append(Readmit(meta["name"], meta.get("uid", ""), Event(
            "Warning", reason, f"group {group}: {why}; deleting the group's Workload so that Kueue admits the "
                               "group again whole, into one rack with room", once=False)))
    return out


def awaits_kueue(workloads: list[dict[str, Any]], pods: list[dict[str, Any]], sets: Mapping[str, str]) -> bool:
    """Some group has an admitted Workload but a live pod not bound to a tray (gated or Pending): Kueue
    may be replacing a failed tray, which the reconciler then checks again soon (Workloads are
    not watched)."""
    admitted = {_workload_group(w, sets) for w in workloads if kworkloads.is_admitted(w)}
    return any(_pod_group(p) in admitted and not kpods.node_name(p) and not kpods.is_terminating(p)
               for p in pods)
