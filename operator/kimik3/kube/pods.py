"""What a pod's labels and status mean, for pods as plain dicts (the API's JSON) or as the
``kubernetes`` client's models (``V1Pod``). Used by the controller, status, autoscaler, dev
cluster, engine simulator and benchmarks alike.

Sources: the core/v1 Pod API (conditions ``Ready``, ``PodScheduled``, ``DisruptionTarget``; kube-scheduler sets
``PodScheduled=False`` with reason ``Unschedulable`` when no node fits, ``SchedulingGated`` while a
scheduling gate holds the pod), LeaderWorkerSet v0.9 (the group and worker index labels).
"""

from __future__ import annotations

from typing import Any

from kimik3.kube.objects import condition as condition  # part of this module's API (pods.condition)
from kimik3.kube.objects import field, is_deleting, is_true
from kimik3.kube.labels import (GPU_RESOURCE, LEADER_WORKER_INDEX, LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL,
                               LWS_WORKER_INDEX_LABEL)

READY = "Ready"
"""Pod condition: every container passes its readiness probe."""
POD_SCHEDULED = "PodScheduled"
"""Pod condition: bound to a node (``False`` while the scheduler cannot or may not place it)."""
UNSCHEDULABLE = "Unschedulable"
"""Reason of ``PodScheduled=False`` when the scheduler found no node that fits."""
DISRUPTION_TARGET = "DisruptionTarget"
"""Pod condition Kubernetes sets (``True``) before it deletes a pod for a taint, an eviction,
a preemption or pod GC; its reason says which."""


def labels(pod: Any) -> dict[str, str]:
    """The pod's labels ({} when it has none)."""
    return field(field(pod, "metadata"), "labels") or {}


def group_index(pod: Any) -> str | None:
    """The LeaderWorkerSet group the pod belongs to (``"0"``, ``"1"``...), None for a pod of no group."""
    return labels(pod).get(LWS_GROUP_INDEX_LABEL)


def by_group(pods: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """``pods`` by group: (LeaderWorkerSet name, group index) -> its pods, in the order given. A
    deployment's rollout runs two LeaderWorkerSets, each with a group 0; pods of no group are left out."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for pod in pods:
        lws, index = labels(pod).get(LWS_NAME_LABEL), group_index(pod)
        if lws and index is not None and index.isdigit():
            out.setdefault((lws, int(index)), []).append(pod)
    return out


def worker_index(pod: Any) -> int | None:
    """The pod's rank in its group (0 = leader), None for a pod of no group."""
    value = labels(pod).get(LWS_WORKER_INDEX_LABEL)
    return None if value is None else int(value)


def is_leader(pod: Any) -> bool:
    """The group's rank 0 (LeaderWorkerSet worker index 0): the pod that serves the API."""
    return labels(pod).get(LWS_WORKER_INDEX_LABEL) == LEADER_WORKER_INDEX


def role(pod: Any) -> str:
    """``"leader"`` or ``"worker"``."""
    return "leader" if is_leader(pod) else "worker"


def phase(pod: Any) -> str | None:
    """``status.phase``: Pending, Running, Succeeded, Failed, Unknown; None before the API server set it."""
    value: str | None = field(field(pod, "status"), "phase")
    return value


def is_terminating(pod: Any) -> bool:
    """Deletion requested (``metadata.deletionTimestamp`` set): what kubectl shows as Terminating."""
    return is_deleting(pod)


def is_ready(pod: Any) -> bool:
    """Condition ``Ready`` is ``True`` and the pod is not terminating (a pod being deleted no
    longer counts toward its group, whatever its probes said last)."""
    return is_true(pod, READY) and not is_terminating(pod)


def ready_since(pod: Any) -> str | None:
    """When the pod last became Ready (the ``Ready`` condition's ``lastTransitionTime``, RFC 3339),
    None while it is not Ready or the time is missing."""
    c = condition(pod, READY)
    return field(c, "lastTransitionTime") if field(c, "status") == "True" else None


def is_unschedulable(pod: Any) -> bool:
    """The scheduler found no node for it: ``PodScheduled=False`` with reason ``Unschedulable``,
    and the pod is not terminating (the scheduler no longer tries to place a pod being deleted,
    so it does not say the group cannot be placed)."""
    c = condition(pod, POD_SCHEDULED)
    return (field(c, "status") == "False" and field(c, "reason") == UNSCHEDULABLE
            and not is_terminating(pod))


def unschedulable_message(pod: Any) -> str:
    """The scheduler's message for an unschedulable pod, stripped ("" otherwise)."""
    if not is_unschedulable(pod):
        return ""
    return (field(condition(pod, POD_SCHEDULED), "message") or "").strip()


def scheduling_problem(pod: Any) -> str:
    """Why the pod is not on a node, ``"<reason>: <message>"`` from ``PodScheduled=False``
    (e.g. ``"Unschedulable: 0/12 nodes are available: ..."``, ``"SchedulingGated: ..."``; the
    reason alone without a message); "" when it is scheduled or the scheduler has not looked at
    it yet."""
    c = condition(pod, POD_SCHEDULED)
    if field(c, "status") != "False":
        return ""
    reason, message = field(c, "reason") or UNSCHEDULABLE, (field(c, "message") or "").strip()
    return f"{reason}: {message}" if message else reason


def scheduling_gates(pod: Any) -> list[str]:
    """Names of the pod's scheduling gates (``spec.schedulingGates``): while any is left the
    scheduler does not place it. Kueue sets ``kueue.x-k8s.io/admission`` (and ``.../topology``)
    until it admits the pod's group."""
    return [str(field(g, "name")) for g in field(field(pod, "spec"), "schedulingGates", "scheduling_gates") or []]


def node_name(pod: Any) -> str:
    """The node the pod is bound to ("" while it is not)."""
    return field(field(pod, "spec"), "nodeName", "node_name") or ""


def holds_node(pod: Any) -> bool:
    """Bound to a node and not finished (phase neither Succeeded nor Failed): its requests count
    against the node's allocatable, as kube-scheduler counts them."""
    return bool(node_name(pod)) and phase(pod) not in ("Succeeded", "Failed")


def gpu_request(pod: dict[str, Any]) -> int:
    """``nvidia.com/gpu`` the pod's containers request (the limit where no request is set)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers", []):
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(GPU_RESOURCE) or (res.get("limits") or {}).get(GPU_RESOURCE)
        total += int(value or 0)
    return total
