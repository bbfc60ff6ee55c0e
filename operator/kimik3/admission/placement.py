"""Placement: Kueue mode names the LocalQueue its groups are submitted to; exclusive mode takes
no Kueue settings (they would be silently ignored); burst groups need a reserved class above them."""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError


def kueue_needs_queue(c: Candidate) -> list[SpecError]:
    p = c.spec.scheduling.placement
    if p.mode == "kueue" and not p.queue_name:
        return [SpecError("spec.scheduling.placement.queueName", "mode kueue needs queueName: the LocalQueue of this "
                                                                 "namespace the groups are submitted to (kubectl get localqueues)")]
    return []


def exclusive_takes_no_kueue_settings(c: Candidate) -> list[SpecError]:
    p = c.spec.scheduling.placement
    given = [name for name, value in (("queueName", p.queue_name), ("priorityClass", p.priority_class),
                                      ("burstPriorityClass", p.burst_priority_class)) if value]
    if p.mode == "exclusive" and given:
        one = len(given) == 1
        return [SpecError(f"spec.scheduling.placement.{given[0]}",
                          f"{', '.join(given)} {'applies' if one else 'apply'} to mode kueue only (the mode is "
                          f"exclusive, the default): set mode kueue, or remove {'it' if one else 'them'}")]
    return []


def burst_needs_priority_class(c: Candidate) -> list[SpecError]:
    p = c.spec.scheduling.placement
    if p.burst_priority_class and (not p.priority_class or p.priority_class == p.burst_priority_class):
        return [SpecError("spec.scheduling.placement.burstPriorityClass",
                          "burstPriorityClass needs priorityClass, another WorkloadPriorityClass of a higher value "
                          "for the reserved groups (those up to autoscaling.minReplicas): set priorityClass to that "
                          "class (not burstPriorityClass's), or remove burstPriorityClass")]
    return []


PLACEMENT = Table("placement", (
    Rule(kueue_needs_queue, example(scheduling={"placement": {"mode": "kueue"}}),
         cel=("placement-kueue-needs-queue",)),
    Rule(exclusive_takes_no_kueue_settings, example(scheduling={"placement": {
        "priorityClass": "reserved", "burstPriorityClass": "burst"}}),
         cel=("placement-exclusive-takes-no-kueue-settings",)),
    Rule(burst_needs_priority_class, example(scheduling={"placement": {
        "mode": "kueue", "queueName": "default", "burstPriorityClass": "burst"}}),
         cel=("placement-burst-needs-priority-class",)),
))
