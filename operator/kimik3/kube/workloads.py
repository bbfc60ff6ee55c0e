"""What a Kueue Workload (``kueue.x-k8s.io/v1beta2``, one per group of a LeaderWorkerSet under
placement ``kueue``) says about its group: admitted, or why it waits.

Sources, read in Kueue v0.17.0 and unchanged in v0.19.2: its Workload conditions (``QuotaReserved``,
``Admitted``, ``Evicted``, ``Preempted``) and the messages its scheduler writes, e.g. ``couldn't assign flavors to pod set
leader: insufficient unused quota for nvidia.com/gpu in flavor gb300, 8 more needed`` or
``... topology "nvl72" doesn't allow to fit any of 2 pod(s)`` (kueue.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kimik3.kube.labels import KUEUE_WORKLOAD_INDEX_ANNOTATION
from kimik3.kube.objects import Object, condition, is_true, meta

KueueState = Literal["Admitted", "Pending", "Preempted", "Evicted"]
"""A group's Workload as Kueue sees it: admitted (quota reserved, a rack assigned, pods ungated);
pending (never admitted, or re-queued); preempted (evicted for a higher-priority Workload, waiting
to come back); evicted for another reason (e.g. ``NodeFailures``, ``PodsReadyTimeout``)."""

Wait = Literal["quota", "topology", "preempted", "pending"]
"""Why a group is not admitted: its queue's GPU quota is used up; no NVLink domain has a free
block of trays that fits the group; Kueue evicted it for a higher-priority Workload; anything
else Kueue says (e.g. an inactive queue)."""


NOT_YET_CONSIDERED = "waiting for Kueue to reserve quota"
"""The message of a group whose Workload Kueue has not considered yet (no ``QuotaReserved`` message)."""


@dataclass(frozen=True)
class Waiting:
    """A group Kueue has not admitted."""

    group: str
    """The group index (``kueue.x-k8s.io/component-workload-index``), "?" when absent."""
    why: Wait
    message: str
    """Kueue's own message (condition message), quoted as it is."""


def group_index(workload: Object) -> str:
    return (meta(workload).get("annotations") or {}).get(KUEUE_WORKLOAD_INDEX_ANNOTATION) or "?"


def is_admitted(workload: Object) -> bool:
    """``Admitted=True``: quota reserved and (with TAS) a topology assignment, pods ungated."""
    return is_true(workload, "Admitted")


def waiting(workload: Object) -> Waiting | None:
    """Why this group waits, or None when it is admitted."""
    if is_admitted(workload):
        return None
    group = group_index(workload)
    for type_ in ("Preempted", "Evicted"):
        c = condition(workload, type_) or {}
        if c.get("status") == "True" and (type_ == "Preempted" or c.get("reason") == "Preempted"):
            return Waiting(group, "preempted", c.get("message") or "preempted")
    message = ((condition(workload, "QuotaReserved") or {}).get("message") or "").strip() or NOT_YET_CONSIDERED
    lowered = message.lower()
    if "insufficient unused quota" in lowered or "insufficient quota" in lowered:
        return Waiting(group, "quota", message)
    if "topology" in lowered and "fit" in lowered:
        return Waiting(group, "topology", message)
    return Waiting(group, "pending", message)


def state(workload: Object) -> tuple[KueueState, str]:
    """The group's Kueue state and Kueue's own message for it ("" when admitted)."""
    if is_admitted(workload):
        return "Admitted", ""
    wait = waiting(workload)
    assert wait is not None
    if wait.why == "preempted":
        return "Preempted", wait.message
    evicted = condition(workload, "Evicted") or {}
    if evicted.get("status") == "True":
        return "Evicted", evicted.get("message") or evicted.get("reason") or "evicted"
    return "Pending", wait.message
