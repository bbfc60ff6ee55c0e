"""What a deployment's ComputeDomain says, as a condition that never decides readiness (F19).

The NVIDIA DRA driver writes a ComputeDomain's ``status.status`` (``Ready`` / ``NotReady``) and
``status.nodes`` (``[{name, ipAddress, cliqueID, index, status}]``, one per node whose IMEX
daemon joined). After a tray replacement it was seen to list 1 of 2 nodes and stay ``NotReady``
for 20 minutes while the engine served (failure case F19 a), so:

- ``Ready`` comes from the groups (the LeaderWorkerSet's ready groups, i.e. the leaders'
  ``/health``), never from the ComputeDomain;
- ``ComputeDomainReady`` reports the domain: True ``AllNodesJoined`` when every node that runs a
  pod of the deployment is listed Ready; False ``ResourceSliceMissing`` naming each such tray
  that publishes no device of the driver (``DRIVER``: no ResourceSlice, its kubelet plugin is
  down: a pod recreated there cannot get its channel), ``NodesNotReady`` naming each such tray
  whose daemon the driver lists NotReady, ``NodesMissing`` naming the nodes seen and the nodes
  missing, each with the driver's own status; Unknown ``NotReported`` before the driver wrote a
  status or while no pod is on a node. The driver's overall ``status.status`` is Ready with
  ``numNodes: 0`` (what the operator renders) once every listed daemon is Ready (its
  ``calculateGlobalStatus``, v25.12.0), and only quoted here: the nodes decide;
- the operator never deletes and recreates a ComputeDomain that pods use (reconcile.py, F4).

A group recreated while its ComputeDomain is NotReady can have pods the kubelet cannot start:
its Warning Event ``FailedPrepareDynamicResources`` ("... already allocated": the channel is
still held by the old group's claim) repeats on every pod sync retry while the pod stays
Pending on its node (failure case F19 b). Nothing fails, so nothing recreates the group (no
container terminates: bounded recreation counts none of it), and nothing says why it waits. So
the reconciler lists those Events (core/v1, one field-selected list per reconcile, only while a
pod of the deployment is Pending on a node) and ``prepare_failures`` picks each pod whose
Events go back longer than ``prepare_bound_s``: ``ComputeDomainReady=False PrepareFailed``
names the first such pod, its node and the kubelet's message, and ``status.groups[].message``
each group's (``with_prepare_failures``). The operator changes nothing: the kubelet keeps
retrying and the pod starts once its claim can be prepared.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kimik3.api.conditions import Event, EventReason, Reason, Verdict
from kimik3.api.v1alpha1 import GroupStatus
from kimik3.kube import pods as kpods
from kimik3.kube.times import parse_rfc3339, rfc3339

__all__ = ["DRIVER", "FAILED_PREPARE", "KUBELET_RETRY_S", "PREPARE_EVENTS", "PREPARE_POLL_S", "SLICES_OF_DRIVER", "SLICES_POLL_S", "PrepareFailure",
           "compute_domain_verdict", "prepare_bound_s", "prepare_failures", "unprepared_pods", "verdict_event",
           "with_prepare_failures"]

DRIVER = "compute-domain.nvidia.com"
"""The DRA driver name of NVIDIA's ComputeDomain kubelet plugin: its ResourceSlices (``spec.driver``)
carry each tray's IMEX channel device."""
SLICES_OF_DRIVER = f"spec.driver={DRIVER}"
"""Field selector of those ResourceSlices."""
SLICES_POLL_S = 30.0
"""Seconds between two lists of those ResourceSlices while engine pods run on trays: the operator
watches no ResourceSlice (cluster-scoped, one list per deployment is cheaper than a watch of
every tray's), so a tray whose slice went is named within this bound."""
FAILED_PREPARE = "FailedPrepareDynamicResources"
"""Reason of the kubelet's Warning Event when it cannot prepare a pod's resource claims
(kubelet ``events.FailedPrepareDynamicResources``, Kubernetes 1.34+)."""
PREPARE_EVENTS = f"reason={FAILED_PREPARE},involvedObject.kind=Pod"
"""Field selector of those Events (core/v1 Events index ``reason`` and ``involvedObject.*``)."""
KUBELET_RETRY_S = 15.0
"""At most this long between two attempts of the kubelet to start a pod whose sync failed: its pod
workers retry after ``backOffPeriod`` (10 s) with a jitter factor of 0.5, i.e. 10-15 s."""
PREPARE_POLL_S = 10.0
"""Seconds between two lists of the Events while a pod is Pending on a node and none came yet
(the kubelet's retry period: about one new Event each)."""
DEFAULT_GRACE_S = 30
"""``terminationGracePeriodSeconds`` the API server gives a pod that sets none."""
MESSAGE_LIMIT = 300
"""Characters of the kubelet's message quoted."""


@dataclass(frozen=True)
class PrepareFailure:
    """A pod whose resource claims the kubelet has failed to prepare for longer than its bound."""

    pod: str
    group: str
    node: str
    since: str
    """The first Event's time (RFC 3339, the kubelet's clock)."""
    message: str
    """The kubelet's latest message (``MESSAGE_LIMIT`` characters)."""

    def text(self) -> str:
        return (f"pod {self.pod} on {self.node} has not started since {self.since}: {FAILED_PREPARE}: "
                f"{self.message}")


def prepare_bound_s(pod: dict[str, Any]) -> float:
    """Seconds a pod may fail to prepare its claims before it is reported: its
    ``terminationGracePeriodSeconds`` (the old group's pods, of the same template, may hold the
    ComputeDomain channel that long while they stop: "already allocated" is expected meanwhile)
    plus ``KUBELET_RETRY_S`` (one more kubelet attempt after they are gone). The rendered engine
    pods stop within 60 s, so **75 s**."""
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(DEFAULT_GRACE_S if grace is None else grace) + KUBELET_RETRY_S


def unprepared_pods(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods bound to a node whose containers have not started: Pending, not being deleted."""
    return [p for p in pods if kpods.node_name(p) and not kpods.is_terminating(p)
            and kpods.phase(p) in (None, "Pending")]


def _span(event: dict[str, Any]) -> tuple[dt.datetime, dt.datetime] | None:
    """When an Event was first and last seen: ``firstTimestamp`` / ``lastTimestamp`` as the
    kubelet's recorder writes them, else (events.k8s.io) ``eventTime`` / ``series.lastObservedTime``."""
    start = parse_rfc3339(event.get("firstTimestamp")) or parse_rfc3339(event.get("eventTime"))
    if start is None:
        return None
    return start, (parse_rfc3339(event.get("lastTimestamp")) or parse_rfc3339((event.get("series") or {}).get("lastObservedTime"))
                   or start)


def prepare_failures(pods: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]],
                     now: dt.datetime) -> tuple[list[PrepareFailure], float | None]:
    """The ``unprepared_pods`` of ``pods`` whose ``FAILED_PREPARE`` Events (matched by the pod's
    uid: a recreated pod has its predecessor's name) began ``prepare_bound_s`` or longer before
    ``now``, leaders first, and the seconds until the next one may qualify (None: none waits)."""
    waiting: dict[str, dict[str, Any]] = {p["metadata"]["uid"]: p for p in unprepared_pods(pods)
                                          if p["metadata"].get("uid")}
    first: dict[str, tuple[dt.datetime, dt.datetime, str]] = {}
    for event in events:
        uid = str((event.get("involvedObject") or {}).get("uid") or "")
        if uid not in waiting:
            continue
        span = _span(event)
        if span is None:
            continue
        start, last = span
        seen = first.get(uid)
        if seen is None:
            first[uid] = (start, last, event.get("message") or "")
        else:
            latest = (last, event.get("message") or "") if last >= seen[1] else (seen[1], seen[2])
            first[uid] = (min(start, seen[0]), *latest)
    out, next_s = [], None
    for uid, pod in sorted(waiting.items(), key=lambda item: (not kpods.is_leader(item[1]),
                                                            item[1]["metadata"]["name"])):
        if uid not in first:
            next_s = PREPARE_POLL_S if next_s is None else min(next_s, PREPARE_POLL_S)
            continue
        start, _, message = first[uid]
        left = (start - now).total_seconds() + prepare_bound_s(pod)
        if left > 0:
            next_s = left if next_s is None else min(next_s, left)
            continue
        out.append(PrepareFailure(pod["metadata"]["name"], kpods.group_index(pod) or "?", kpods.node_name(pod),
                                  rfc3339(start), message[:MESSAGE_LIMIT]))
    return out, next_s


def with_prepare_failures(groups: list[GroupStatus], failures: list[PrepareFailure]) -> list[GroupStatus]:
    """``groups`` with each group's message saying which of its pods cannot start and why."""
    by_group: dict[str, list[PrepareFailure]] = {}
    for f in failures:
        by_group.setdefault(f.group, []).append(f)
    return [g.model_copy(update={"message": "; ".join(f.text() for f in by_group[str(g.index)])})
            if str(g.index) in by_group else g for g in groups]


def compute_domain_verdict(domain: dict[str, Any] | None, pods: list[dict[str, Any]],
                           failures: list[PrepareFailure] | None = None,
                           sliced: set[str] | None = None) -> Verdict | None:
    """The ``ComputeDomainReady`` verdict of ``domain`` (None when the deployment has none) for
    the deployment's ``pods``; ``failures`` (``prepare_failures``) make it ``PrepareFailed``;
    ``sliced``: the nodes with a ResourceSlice of ``DRIVER`` (None: not known, e.g. no
    permission to list them)."""
    if domain is None:
        return None
    name = domain["metadata"]["name"]
    expected = sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
    status = domain.get("status") or {}
    if failures:
        f = failures[0]
        more = f" ({len(failures)} pods; status.groups has each group's)" if len(failures) > 1 else ""
        return Verdict("False", Reason.PREPARE_FAILED,
                       f"group {f.group}: {f.text()}{more}; ComputeDomain {name} is "
                       f"{status.get('status') or 'not reported'}. The operator recreates nothing: the kubelet "
                       "retries and the pod starts once its claim is prepared")
    unsliced = [n for n in expected if sliced is not None and n not in sliced]
    overall = status.get("status") or "not reported"
    if unsliced:
        return Verdict("False", Reason.RESOURCE_SLICE_MISSING,
                       f"ComputeDomain {name} ({overall}): no ResourceSlice of {DRIVER} on {', '.join(unsliced)}, "
                       "where engine pods run: the DRA kubelet plugin there is down, and a pod recreated on "
                       "that tray cannot get its IMEX channel. Check the driver's kubelet plugin on it")
    if not expected or not status:
        return Verdict("Unknown", Reason.NOT_REPORTED,
                       f"ComputeDomain {name}: " + ("no engine pod is on a node yet" if not expected else
                                                    "the DRA driver has not reported its status yet"))
    listed = {n["name"]: n.get("status", "Ready") for n in status.get("nodes") or [] if n.get("name")}
    seen = sorted(n for n, state in listed.items() if state == "Ready")
    not_ready = [n for n in expected if listed.get(n, "Ready") != "Ready"]
    missing = [n for n in expected if n not in listed]
    if not_ready:
        return Verdict("False", Reason.NODES_NOT_READY,
                       f"ComputeDomain {name} ({overall}): the IMEX daemon is NotReady on {', '.join(not_ready)}"
                       + (f"; not listed: {', '.join(missing)}" if missing else "")
                       + ". Readiness still comes from the groups' /health; the ComputeDomain is not recreated "
                       "while pods use it")
    if not missing:
        return Verdict("True", Reason.ALL_NODES_JOINED,
                       f"ComputeDomain {name} ({overall}): {len(expected)}/{len(expected)} nodes of the engine pods joined")
    return Verdict("False", Reason.NODES_MISSING,
                   f"ComputeDomain {name} ({overall}) lists {len(expected) - len(missing)} of {len(expected)} nodes "
                   f"of the engine pods: seen {', '.join(seen) or 'none'}; missing {', '.join(missing)}. Readiness "
                   "still comes from the groups' /health; the ComputeDomain is not recreated while pods use it")


VERDICT_EVENTS: dict[Reason, EventReason] = {Reason.PREPARE_FAILED: EventReason.COMPUTE_DOMAIN_PREPARE_FAILED,
                                             Reason.NODES_MISSING: EventReason.COMPUTE_DOMAIN_NODES_MISSING,
                                             Reason.NODES_NOT_READY: EventReason.COMPUTE_DOMAIN_NODES_MISSING,
                                             Reason.RESOURCE_SLICE_MISSING: EventReason.COMPUTE_DOMAIN_NODES_MISSING}
"""The Warning Event of each ``ComputeDomainReady=False`` reason."""


def verdict_event(verdict: Verdict | None) -> Event | None:
    """The Warning Event that says ``verdict`` (``compute_domain_verdict``) when it is
    ``ComputeDomainReady=False``; None otherwise."""
    if verdict is None or verdict.status != "False" or verdict.reason not in VERDICT_EVENTS:
        return None
    return Event("Warning", VERDICT_EVENTS[verdict.reason], verdict.message)
