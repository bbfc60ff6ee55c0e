"""Placement: Kueue mode names the LocalQueue its groups are submitted to; exclusive mode takes
no Kueue settings (they would be silently ignored); burst groups need a reserved class above them."""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError


def kueue_needs_queue(c: Candidate) -> list[SpecError]:
    p = c.spec.scheduling.placement
    path = "spec.scheduling.placement"
    if p.mode == "kueue" and not p.queue_name:
        return [SpecError(f"{path}.queueName", "mode kueue needs queueName: the LocalQueue of this namespace the "
                                               "groups are submitted to (kubectl get localqueues)")]
    if p.mode == "exclusive" and (p.queue_name or p.priority_class):
        field = "queueName" if p.queue_name else "priorityClass"
        return [SpecError(f"{path}.{field}", f"{field} applies to mode kueue only: set mode kueue, or remove it")]
    return []


def burst_needs_priority_class(c: Candidate) -> list[SpecError]:
    p = c.spec.scheduling.placement
    if p.burst_priority_class and (not p.priority_class or p.priority_class == p.burst_priority_class):
        return [SpecError("spec.scheduling.placement.burstPriorityClass",
                          "burstPriorityClass needs priorityClass, a different WorkloadPriorityClass of a higher value "
                          "for the reserved groups (those up to autoscaling.minReplicas): set priorityClass, or remove "
                          "burstPriorityClass")]
    return []


PLACEMENT = Table("placement", (
    Rule(kueue_needs_queue, example(scheduling={"placement": {"mode": "kueue"}}),
         cel=("placement-kueue-needs-queue",)),
    Rule(burst_needs_priority_class, example(scheduling={"placement": {
        "mode": "kueue", "queueName": "default", "burstPriorityClass": "burst"}}),
         cel=("placement-burst-needs-priority-class",)),
))
