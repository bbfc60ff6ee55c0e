"""Reserved and burst capacity under placement kueue (``spec.scheduling.placement.burstPriorityClass``).

The groups up to ``reserved_groups`` of each LeaderWorkerSet are reserved: admitted at
``placement.priorityClass``; the groups above them are burst: admitted at ``burstPriorityClass``, a
lower WorkloadPriorityClass, so another tenant's reserved group preempts them, never a reserved one
(with ClusterQueues that preempt ``LowerPriority`` only: recipes/README.md).

Why the operator writes each group's priority. Kueue makes one Workload per group of a
LeaderWorkerSet and gives each the priority of the set's ``kueue.x-k8s.io/priority-class`` label
(``PrepareWorkloadPriority`` in ``pkg/controller/jobs/leaderworkerset/leaderworkerset_reconciler.go``);
a set has one pod template and one label for all its groups, so nothing rendered tells a reserved
group from a burst one. Read in Kueue v0.19.2 and checked with its manager
(tests/e2e/test_e2e_kueue.py):

- ``Workload.spec.priority`` may change at any time (no CEL rule or webhook check holds it; the
  CRD asks only that it be set beside ``priorityClassRef``), and Kueue's scheduler and preemption
  read it (``pkg/util/priority.Priority``);
- the LeaderWorkerSet reconciler re-resolves a Workload's priority only when the Workload's
  ``priorityClassRef`` names another class than the set's label
  (``jobframework.updateWorkloadPriorities``: "Resolving only when at least one workload needs a
  transition keeps steady-state reconciles from re-resolving and overwriting the otherwise-mutable
  priority value"): a value written under the same class name stays, a changed name is reverted.

So the LeaderWorkerSet carries the burst class (``render.leaderworkerset``): every Workload is
created at the burst value, and no group can preempt at the reserved priority before the operator
knows it is reserved. The operator then writes the reserved class's value into ``spec.priority`` of
each group below ``reserved_groups`` (and the burst value back into a group no longer reserved when
``minReplicas`` falls), with the annotation ``CAPACITY_ANNOTATION`` saying which; its
``priorityClassRef`` keeps naming the burst class.

Kueue's WorkloadPriorityClass controller sets every Workload naming a class back to the class's
value when the class is created or its value changes, and so for every class when its manager
starts (``pkg/controller/core/workloadpriorityclass_controller.go``: its create predicate passes the
informer's initial list). The operator, which does not watch Workloads, checks them again every
``RECHECK_S``: after a Kueue restart a reserved group runs at the burst priority that long at most.

A LeaderWorkerSet scales down from its highest group index, so burst groups go first. During a
rollout each LeaderWorkerSet has its own reserved indices (the old and the new set may together
hold up to twice the reserved groups for a while).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kimik3.api.conditions import Event, EventReason
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.controller.fleet import EngineSet
from kimik3.kube import workloads as kworkloads
from kimik3.kube.groups import BURST, RESERVED
from kimik3.kube.labels import CAPACITY_ANNOTATION, KUEUE_JOB_UID_LABEL

RECHECK_S = 30.0
"""How often the Workload priorities of a deployment with burst capacity are read again, seconds
(Kueue may set a raised one back: see the module)."""

Capacity = Literal["reserved", "burst"]
"""``kube.groups.RESERVED`` or ``BURST``."""


def reserved_groups(spec: KimiK3DeploymentSpec) -> int | None:
    """How many groups of each LeaderWorkerSet are reserved: ``autoscaling.minReplicas`` with
    autoscaling on, else every group (a fixed ``replicas`` is all reserved); None without
    ``placement.burstPriorityClass`` (no group is told apart)."""
    placement = spec.scheduling.placement
    if placement.mode != "kueue" or not placement.burst_priority_class:
        return None
    return spec.autoscaling.min_replicas if spec.autoscaling.enabled else spec.replicas


def capacity_of(reserved: int | None, index: int) -> Capacity | None:
    """Group ``index``'s capacity given ``reserved_groups`` (None when it is None)."""
    if reserved is None:
        return None
    return RESERVED if index < reserved else BURST


@dataclass(frozen=True)
class Priorities:
    """The values (``value`` of each WorkloadPriorityClass, read from the API server) of the two classes."""

    reserved: int
    """``placement.priorityClass``'s value."""
    burst: int
    """``placement.burstPriorityClass``'s value."""


@dataclass(frozen=True)
class Reprioritize:
    """A group's Workload whose ``spec.priority`` or capacity annotation the operator writes."""

    workload: str
    uid: str
    """The Workload's UID, in the patch: the API server refuses it on a fresh Workload of the same name."""
    capacity: Capacity
    priority: int
    event: Event | None
    """Said when the priority changes (None: only the annotation of a Workload Kueue created at the burst value)."""

    def patch(self) -> dict[str, Any]:
        """The merge patch of the Workload."""
        return {"metadata": {"uid": self.uid, "annotations": {CAPACITY_ANNOTATION: self.capacity}},
                "spec": {"priority": self.priority}}


def reprioritizations(spec: KimiK3DeploymentSpec, workloads: list[dict[str, Any]], sets: Mapping[str, str],
                      priorities: Priorities) -> list[Reprioritize]:
    """The Workloads (of the deployment's LeaderWorkerSets: ``sets``, uid -> name) whose
    ``spec.priority`` is not their capacity's value or whose annotation does not say it."""
    reserved = reserved_groups(spec)
    placement = spec.scheduling.placement
    out = []
    for w in workloads:
        meta = w.get("metadata") or {}
        index = kworkloads.group_index(w)
        lws = sets.get((meta.get("labels") or {}).get(KUEUE_JOB_UID_LABEL) or "")
        capacity = capacity_of(reserved, int(index)) if index.isdigit() else None
        if capacity is None or lws is None or meta.get("deletionTimestamp"):
            continue
        value, name = (priorities.reserved, placement.priority_class) if capacity == RESERVED \
            else (priorities.burst, placement.burst_priority_class)
        current = (w.get("spec") or {}).get("priority")
        if current == value and (meta.get("annotations") or {}).get(CAPACITY_ANNOTATION) == capacity:
            continue
        event = None
        if current != value:
            what = ("never preempted for another tenant's burst" if capacity == RESERVED
                    else "preemptible by another tenant's reserved groups")
            event = Event("Normal", EventReason.GROUP_CAPACITY,
                          f"group {index} of LeaderWorkerSet {lws} is {capacity} capacity: its Workload's priority "
                          f"set to {value} (WorkloadPriorityClass {name}, was {current}), {what}", once=False)
        out.append(Reprioritize(meta["name"], meta.get("uid", ""), capacity, value, event))
    return out


def missing_reserved(spec: KimiK3DeploymentSpec, workloads: list[dict[str, Any]], sets: list[EngineSet]) -> bool:
    """Some reserved group of a live LeaderWorkerSet has no Workload yet: Kueue creates it a moment
    after the set grows, and the operator, which does not watch Workloads, looks again soon to
    raise its priority."""
    reserved = reserved_groups(spec)
    if reserved is None:
        return False
    seen = {(((w.get("metadata") or {}).get("labels") or {}).get(KUEUE_JOB_UID_LABEL, ""), kworkloads.group_index(w))
            for w in workloads}
    return any((s.lws["metadata"].get("uid", ""), str(i)) not in seen
               for s in sets if not s.deleting for i in range(min(reserved, s.replicas)))
