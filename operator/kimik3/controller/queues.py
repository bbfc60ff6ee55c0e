"""Placement kueue: is the deployment's queue served? Checked before a group is created.

Without this check a ``kueue`` deployment falls back silently where Kueue does not serve its
queue: with no Kueue API the LeaderWorkerSet's pods are scheduled as if Kueue did not exist (no
gang, no quota, a group's pods free to land in two racks) while the CR says its groups are placed;
with no LocalQueue, or one whose ClusterQueue is missing or inactive, Kueue keeps every pod gated
for ever. So before an apply that would create groups (a new LeaderWorkerSet, or more replicas of
a live one: ``creating``) the reconcile reads the LocalQueue ``queueName``
(``snapshot.Reader.local_queue``); ``queue_verdict`` says what is missing and the fix, and
``steps.gate`` holds the LeaderWorkerSet and the ComputeDomain back: no engine pod exists
meanwhile. Groups already running stay (Kueue keeps their Workloads; their state is read from them).

What Kueue writes on a LocalQueue, read in v0.19.2 (``pkg/controller/core/localqueue_controller.go``,
the same in v0.17.0): condition ``Active``, False with reason ``ClusterQueueDoesNotExist`` or
``ClusterQueueIsInactive`` (message "Can't submit new workloads to clusterQueue"), or ``Stopped``
(its ``spec.stopPolicy``). A LocalQueue with no ``Active`` condition yet (just created, or no
Kueue manager running) is not held: Kueue's webhooks gate the pods and the Workloads say why.

Kueue's webhooks: once Kueue reports the LocalQueue active (so a Kueue manager runs), the
LeaderWorkerSet about to be applied is first applied as a dry run (``dryRun=All``: the API server
runs the admission webhooks and stores nothing). Kueue's LeaderWorkerSet webhook marks each pod
template it will manage (``KUEUE_SUSPENDING_PARENT_ANNOTATION``; its pod webhook then gates the
pods); a dry run that comes back unmarked means no Kueue webhook will see the groups, whose pods
would then be scheduled as if Kueue did not exist: ``KueueWebhookMissing``. A dry run the API server
refuses (e.g. Kueue's webhook unreachable) is not judged here: the real apply fails the same way
and ``ApplyFailed`` quotes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimik3.api.conditions import Reason, Verdict
from kimik3.controller.fleet import EngineSet
from kimik3.kube.kinds import LEADER_WORKER_SET, LOCAL_QUEUE
from kimik3.kube.labels import KUEUE_SUSPENDING_PARENT_ANNOTATION
from kimik3.kube.objects import condition

POLL_S = 10.0
"""Look again this soon while groups are held for the queue (LocalQueues are not watched), seconds."""
HELD = "no group is created"
"""How each verdict's message starts."""


@dataclass(frozen=True)
class QueueRead:
    """What reading the LocalQueue ``name`` of ``namespace`` gave."""

    name: str
    namespace: str
    local_queue: dict[str, Any] | None = None
    """The LocalQueue; None when it does not exist (or could not be read)."""
    served: bool = True
    """False: the API server does not serve ``kueue.x-k8s.io/v1beta2`` (a 404 with no Status body)."""
    refused: str = ""
    """The API server's refusal of the read (403: RBAC), "" when it answered."""
    marked: bool | None = None
    """The LeaderWorkerSet's dry run came back with Kueue's mark on every pod template; None: no dry
    run (the LocalQueue is not reported active, or the API server refused the dry run)."""


def kueue_marked(lws: dict[str, Any]) -> bool:
    """Every pod template of ``lws`` (as the API server returned it) carries Kueue's mark."""
    template = lws["spec"]["leaderWorkerTemplate"]
    pods = [template["workerTemplate"], *([template["leaderTemplate"]] if "leaderTemplate" in template else [])]
    return all(KUEUE_SUSPENDING_PARENT_ANNOTATION in ((p.get("metadata") or {}).get("annotations") or {})
               for p in pods)


def creating(sets: Sequence[EngineSet], objects: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first LeaderWorkerSet of ``objects`` whose apply would create groups (see ``adds_groups``), None if none."""
    live = {s.name: s for s in sets}
    for obj in objects:
        if obj["kind"] != LEADER_WORKER_SET.kind:
            continue
        current = live.get(obj["metadata"]["name"])
        if current is None or int(obj["spec"]["replicas"]) > current.replicas:
            return obj
    return None


def queue_verdict(read: QueueRead) -> Verdict | None:
    """``ScalingLimited=True`` naming what is missing and the fix, or None when the queue is served
    as far as the LocalQueue shows (see the module)."""
    where = f"LocalQueue {read.name} (namespace {read.namespace})"
    if not read.served:
        return Verdict("True", Reason.KUEUE_NOT_INSTALLED, (
            f"{HELD}: the API server does not serve Kueue's API ({LOCAL_QUEUE.api_version}), so nothing would "
            "admit the groups or keep each in one rack: install Kueue v0.17.2 or later (CRDs, manager, webhooks, "
            "the LeaderWorkerSet integration), or set spec.scheduling.placement.mode: exclusive"))
    if read.refused:
        return Verdict("True", Reason.QUEUE_UNREADABLE, (
            f"{HELD}: the operator may not read {where} ({read.refused}): grant it get on "
            "localqueues.kueue.x-k8s.io (the chart's ClusterRole does)"))
    if read.local_queue is None:
        return Verdict("True", Reason.LOCAL_QUEUE_MISSING, (
            f"{HELD}: {where} does not exist: create it (spec.clusterQueue: a ClusterQueue covering "
            "nvidia.com/gpu; the chart's kueue.tenants does), or set spec.scheduling.placement.queueName to a "
            "LocalQueue of this namespace"))
    active = condition(read.local_queue, "Active") or {}
    if active.get("status") == "True" and read.marked is False:
        return Verdict("True", Reason.KUEUE_WEBHOOK_MISSING, (
            f"{HELD}: Kueue reports {where} active, but a dry run of the LeaderWorkerSet came back without "
            f"Kueue's {KUEUE_SUSPENDING_PARENT_ANNOTATION} mark: no Kueue webhook would gate its pods, which "
            "would be scheduled with no admission and could split a group across racks. Register Kueue's "
            "webhooks (mleaderworkerset.kb.io and mpod.kb.io, its MutatingWebhookConfiguration) with the "
            "LeaderWorkerSet integration on, and keep this namespace in its managedJobsNamespaceSelector"))
    if active.get("status") != "False":
        return None
    cluster_queue = (read.local_queue.get("spec") or {}).get("clusterQueue") or "?"
    why, said = active.get("reason") or "", active.get("message") or ""
    if why == "ClusterQueueDoesNotExist":
        return Verdict("True", Reason.CLUSTER_QUEUE_MISSING, (
            f"{HELD}: {where} points at ClusterQueue {cluster_queue}, which does not exist (Kueue: {said}): "
            f"create ClusterQueue {cluster_queue}, or point the LocalQueue at one that exists"))
    if why == "ClusterQueueIsInactive":
        return Verdict("True", Reason.QUEUE_INACTIVE, (
            f"{HELD}: ClusterQueue {cluster_queue} of {where} is inactive (Kueue: {said}): "
            f"`kubectl describe clusterqueue {cluster_queue}` says why (e.g. a missing ResourceFlavor or "
            "Topology, or its stopPolicy)"))
    return Verdict("True", Reason.QUEUE_INACTIVE, (
        f"{HELD}: {where} is not active (Kueue: {why}: {said}): e.g. remove its spec.stopPolicy"))
