"""Placement: Kueue mode names the LocalQueue its groups are submitted to; exclusive mode takes
no Kueue settings (they would be silently ignored)."""

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


PLACEMENT = Table("placement", (
    Rule(kueue_needs_queue, example(scheduling={"placement": {"mode": "kueue"}}),
         cel=("placement-kueue-needs-queue",)),
))
