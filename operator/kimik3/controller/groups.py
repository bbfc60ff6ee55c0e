"""``status.groups``: each engine group once (rack, trays, Kueue state with Kueue's own message,
readiness), and the Events that say when a group's Kueue state changed.

Pure functions over what the reconciler read: the deployment's pods and, under placement
``kueue``, the Workloads Kueue made for its groups (one per group index, found by the label
``kueue.x-k8s.io/job-uid`` = the LeaderWorkerSet's uid, ``kube.workloads``). The conditions stay
short and point here (``controller.status``).

Where the values come from: the trays are the pods' ``spec.nodeName``; the racks are the topology
key's label of every live pod's tray (``kube.groups.Group.racks``; the reconciler reads node
labels through ``controller.nodes``: Kueue's node selector on the pods names only the hostname
when that is the Topology's lowest level, and a Workload's topology assignment likewise), and
``rack`` is set only when they are one; the Kueue state is ``kube.workloads.state``. A group
split across racks is not ``ready`` and its message says so first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimik3.api.conditions import Event, EventReason, EventType
from kimik3.api.v1alpha1 import GroupStatus
from kimik3.controller.capacity import capacity_of
from kimik3.controller.fleet import EngineSet
from kimik3.kube import pods as kpods
from kimik3.kube import workloads as kworkloads
from kimik3.kube.groups import Group, GroupKey
from kimik3.kube.labels import KUEUE_JOB_UID_LABEL
from kimik3.kube.workloads import KueueState

GROUP_MESSAGE_LIMIT = 512
"""Characters of a group's message kept (Kueue's messages run to ~200)."""

KUEUE_EVENTS: dict[KueueState, EventReason] = {
    "Admitted": EventReason.GROUP_ADMITTED, "Pending": EventReason.GROUP_PENDING,
    "Preempted": EventReason.GROUP_PREEMPTED, "Evicted": EventReason.GROUP_EVICTED}
"""Event reason posted when a group's Workload enters each Kueue state (Normal for Admitted, else Warning)."""


def _index(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def split_message(group: Group) -> str:
    """What a split group's entry (and ScalingLimited) says: its racks (``Group.split``)."""
    return (f"group {group.index} of LeaderWorkerSet {group.leader_worker_set} has pods in racks "
            f"{' and '.join(group.racks)}: it cannot run as one engine (one NVLink domain per group)")


def group_statuses(groups: Mapping[GroupKey, Group], workloads: list[dict[str, Any]] | None,
                   sets: list[EngineSet], target: EngineSet | None, desired_groups: int,
                   reserved: int | None = None) -> list[GroupStatus]:
    """One entry per group that has pods (``groups``, ``kube.groups.groups_of`` with the trays'
    racks) or a Workload, and per desired group of the ``target`` LeaderWorkerSet
    (``0..desired_groups-1``), sorted by LeaderWorkerSet (old sets first, as in ``sets``) and
    index. ``workloads`` is None outside placement kueue (no Kueue state); ``reserved``: the
    reserved groups of each set (``controller.capacity.reserved_groups``; None: no capacity said)."""
    names = {s.lws["metadata"].get("uid"): s.name for s in sets}
    states: dict[tuple[str, int], tuple[KueueState, str]] = {}
    for workload in workloads or []:
        index = _index(kworkloads.group_index(workload))
        lws = names.get((workload["metadata"].get("labels") or {}).get(KUEUE_JOB_UID_LABEL))
        if index is not None and lws:
            states[(lws, index)] = kworkloads.state(workload)
    order = {s.name: n for n, s in enumerate(sets)}
    wanted = {(target.name, i) for i in range(desired_groups)} if target is not None else set()
    out = []
    for lws, index in sorted(wanted | set(groups) | set(states), key=lambda k: (order.get(k[0], len(order)), k)):
        found = groups.get((lws, index))
        group = found.pods if found is not None else ()
        racks = list(found.racks) if found is not None else []
        state, message = states.get((lws, index), (None, ""))
        if not message:
            message = next((kpods.unschedulable_message(p) for p in group if kpods.is_unschedulable(p)), "")
        if found is not None and found.split:
            message = split_message(found) + (f"; {message}" if message else "")
        out.append(GroupStatus(
            leader_worker_set=lws, index=index, rack=racks[0] if len(racks) == 1 else None, racks=racks,
            trays=[kpods.node_name(p) for p in group if kpods.node_name(p)],
            kueue=state, message=message[:GROUP_MESSAGE_LIMIT] or None, capacity=capacity_of(reserved, index),
            ready=found is not None and found.serving))
    return out


def stored_groups(obj: dict[str, Any]) -> list[GroupStatus]:
    """``status.groups`` of the CR as it was last written ([] when none)."""
    return [GroupStatus.model_validate(g) for g in (obj.get("status") or {}).get("groups") or []]


def kueue_changes(before: list[GroupStatus], after: list[GroupStatus]) -> list[Event]:
    """The Events of each group whose Kueue state differs from what ``before`` (the stored status)
    says: ``KUEUE_EVENTS``, the message quoting Kueue. A new Workload Kueue has not considered yet
    (it admits most within a second) is no change."""
    previous = {(g.leader_worker_set, g.index): g.kueue for g in before
                if g.message != kworkloads.NOT_YET_CONSIDERED}
    events: list[Event] = []
    for g in after:
        was = previous.get((g.leader_worker_set, g.index))
        if g.kueue is None or was == g.kueue or g.message == kworkloads.NOT_YET_CONSIDERED:
            continue
        type_: EventType = "Normal" if g.kueue == "Admitted" else "Warning"
        reason = KUEUE_EVENTS[g.kueue]
        group = f"group {g.index}" + (f" ({g.capacity})" if g.capacity else "")
        if g.kueue == "Admitted":
            where = f" into rack {g.rack}" if g.rack else ""
            text = f"{group} admitted by Kueue{where} (quota reserved, every pod of the group placed together)"
        else:
            what = {"Pending": "waits for Kueue", "Preempted": "preempted by Kueue",
                    "Evicted": "evicted by Kueue"}[g.kueue]
            text = f"{group} {what}{f' (was {was})' if was else ''}: {g.message or 'no message from Kueue'}"
            if g.kueue == "Preempted":
                text += "; it comes back when room returns"
        events.append(Event(type_, reason, text, once=False))  # each change is news
    return events
