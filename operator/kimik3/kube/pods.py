"""What a pod's labels and status mean, for pods as the API's JSON (``kimik3.kube.objects``: plain
dicts, or kopf's read-only views of them). Used by the controller, status, autoscaler, dev
cluster, engine simulator and benchmarks alike.

Sources: the core/v1 Pod API (conditions ``Ready``, ``PodScheduled``, ``DisruptionTarget``; kube-scheduler sets
``PodScheduled=False`` with reason ``Unschedulable`` when no node fits, ``SchedulingGated`` while a
scheduling gate holds the pod), LeaderWorkerSet v0.9 (the group and worker index labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimik3.kube.objects import Object, is_deleting, is_true
from kimik3.kube.objects import condition as condition  # part of this module's API (pods.condition)
from kimik3.kube.objects import labels as labels  # re-exported: read as pods.labels(pod)
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


def _spec(pod: Object) -> Mapping[str, Any]:
    return pod.get("spec") or {}


def group_index(pod: Object) -> str | None:
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


def worker_index(pod: Object) -> int | None:
    """The pod's rank in its group (0 = leader), None for a pod of no group."""
    value = labels(pod).get(LWS_WORKER_INDEX_LABEL)
    return None if value is None else int(value)


def is_leader(pod: Object) -> bool:
    """The group's rank 0 (LeaderWorkerSet worker index 0): the pod that serves the API."""
    return labels(pod).get(LWS_WORKER_INDEX_LABEL) == LEADER_WORKER_INDEX


def role(pod: Object) -> str:
    """``"leader"`` or ``"worker"``."""
    return "leader" if is_leader(pod) else "worker"


def phase(pod: Object) -> str | None:
    """``status.phase``: Pending, Running, Succeeded, Failed, Unknown; None before the API server set it."""
    return (pod.get("status") or {}).get("phase")


def is_terminating(pod: Object) -> bool:
    """Deletion requested (``metadata.deletionTimestamp`` set): what kubectl shows as Terminating."""
    return is_deleting(pod)


def is_ready(pod: Object) -> bool:
    """Condition ``Ready`` is ``True`` and the pod is not terminating (a pod being deleted no
    longer counts toward its group, whatever its probes said last)."""
    return is_true(pod, READY) and not is_terminating(pod)


def ready_since(pod: Object) -> str | None:
    """When the pod last became Ready (the ``Ready`` condition's ``lastTransitionTime``, RFC 3339),
    None while it is not Ready or the time is missing."""
    c = condition(pod, READY) or {}
    return c.get("lastTransitionTime") if c.get("status") == "True" else None


def is_unschedulable(pod: Object) -> bool:
    """The scheduler found no node for it: ``PodScheduled=False`` with reason ``Unschedulable``,
    and the pod is not terminating (the scheduler no longer tries to place a pod being deleted,
    so it does not say the group cannot be placed)."""
    c = condition(pod, POD_SCHEDULED) or {}
    return c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE and not is_terminating(pod)


def unschedulable_message(pod: Object) -> str:
    """The scheduler's message for an unschedulable pod, stripped ("" otherwise)."""
    if not is_unschedulable(pod):
        return ""
    return ((condition(pod, POD_SCHEDULED) or {}).get("message") or "").strip()


def scheduling_problem(pod: Object) -> str:
    """Why the pod is not on a node, ``"<reason>: <message>"`` from ``PodScheduled=False``
    (e.g. ``"Unschedulable: 0/12 nodes are available: ..."``, ``"SchedulingGated: ..."``; the
    reason alone without a message); "" when it is scheduled or the scheduler has not looked at
    it yet."""
    c = condition(pod, POD_SCHEDULED) or {}
    if c.get("status") != "False":
        return ""
    reason, message = c.get("reason") or UNSCHEDULABLE, (c.get("message") or "").strip()
    return f"{reason}: {message}" if message else reason


def scheduling_gates(pod: Object) -> list[str]:
    """Names of the pod's scheduling gates (``spec.schedulingGates``): while any is left the
    scheduler does not place it. Kueue sets ``kueue.x-k8s.io/admission`` (and ``.../topology``)
    until it admits the pod's group."""
    return [str(g.get("name")) for g in _spec(pod).get("schedulingGates") or []]


def domain_affinity_keys(pod: Object) -> set[str]:
    """The topology keys of the pod's required pod affinity terms
    (``spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[].topologyKey``):
    LeaderWorkerSet's pod webhook adds one on the exclusive-topology key to each pod of a group."""
    terms = ((_spec(pod).get("affinity") or {}).get("podAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []
    return {str(t["topologyKey"]) for t in terms if t.get("topologyKey")}


def node_name(pod: Object) -> str:
    """The node the pod is bound to ("" while it is not)."""
    return _spec(pod).get("nodeName") or ""


def holds_node(pod: Object) -> bool:
    """Bound to a node and not finished (phase neither Succeeded nor Failed): its requests count
    against the node's allocatable, as kube-scheduler counts them."""
    return bool(node_name(pod)) and phase(pod) not in ("Succeeded", "Failed")


def gpu_request(pod: Object) -> int:
    """``nvidia.com/gpu`` the pod's containers request (the limit where no request is set)."""
    total = 0
    for c in _spec(pod).get("containers", []):
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(GPU_RESOURCE) or (res.get("limits") or {}).get(GPU_RESOURCE)
        total += int(value or 0)
    return total
