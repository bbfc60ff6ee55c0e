"""Where a rollout of the engine groups' templates stands, read off the LeaderWorkerSet and its pods.

The LeaderWorkerSet (v0.9.0) does the rolling itself from the ``rolloutStrategy`` the renderer
gives it (``render.revision``); this module reads what it did and says so in the CR:

- each group's revision is its leader pod's ``leaderworkerset.sigs.k8s.io/template-revision-hash``
  label, and a group is Ready when all ``nodes_per_group`` of its pods are (``kube.pods.is_ready``);
- the update revision is the one with as many groups as the LeaderWorkerSet counts in
  ``status.updatedReplicas`` (the highest-indexed on a tie: LWS updates from the top), read only
  once ``status.observedGeneration`` is the LeaderWorkerSet's generation; before that, and while
  it has created no group of its newest revision, it is unknown (None);
- the current revision is that of the lowest-indexed group not on the update revision (LWS
  replaces groups from the highest index down, so group 0 goes last), else the update revision.

Pure functions: no API calls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Reason, Verdict
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus, RevisionGroups, RolloutStatus
from kimik3.kube.labels import LWS_REVISION_LABEL
from kimik3.kube.pods import group_index, is_leader, is_ready, labels

LWS_UPDATE_IN_PROGRESS = "UpdateInProgress"
"""The LeaderWorkerSet's condition while groups below replicas are not all on its newest revision."""


@dataclass(frozen=True)
class Group:
    """One engine group as its pods show it."""

    index: int
    revision: str | None
    """Its leader's revision label (None before the leader pod exists)."""
    ready: bool
    """Every one of its ``nodes_per_group`` pods is Ready."""


def groups(pods: list[dict[str, Any]], nodes_per_group: int) -> list[Group]:
    """The groups ``pods`` belong to, by index."""
    members: dict[int, list[dict[str, Any]]] = {}
    for pod in pods:
        index = group_index(pod)
        if index is not None and index.isdigit():
            members.setdefault(int(index), []).append(pod)
    out = []
    for number, group in sorted(members.items()):
        leader = next((p for p in group if is_leader(p)), None)
        revision = labels(leader).get(LWS_REVISION_LABEL) if leader is not None else None
        out.append(Group(number, revision, len(group) >= nodes_per_group and all(map(is_ready, group))))
    return out


def lws_fresh(lws: dict[str, Any]) -> bool:
    """The LeaderWorkerSet controller has seen the LeaderWorkerSet's latest spec."""
    return int((lws.get("status") or {}).get("observedGeneration") or 0) == int((lws.get("metadata") or {}).get("generation") or 0)


def _update_in_progress(lws: dict[str, Any]) -> bool:
    return any(c.get("type") == LWS_UPDATE_IN_PROGRESS and c.get("status") == "True"
               for c in (lws.get("status") or {}).get("conditions") or [])


def rollout_status(lws: dict[str, Any], members: list[Group]) -> RolloutStatus:
    """``status.rollout`` of a LeaderWorkerSet whose groups are ``members`` (see the module)."""
    counts = Counter(g.revision for g in members if g.revision)
    updated = int((lws.get("status") or {}).get("updatedReplicas") or 0)
    update: str | None = None
    if lws_fresh(lws) and updated > 0 and counts:
        candidates = [r for r, n in counts.items() if n == updated] or list(counts)
        update = max(candidates, key=lambda r: max(g.index for g in members if g.revision == r))
    old = [g for g in members if g.revision and g.revision != update]
    current = old[0].revision if old else update
    order = sorted(counts, key=lambda r: (r != update, r != current, r))
    return RolloutStatus(
        current_revision=current,
        update_revision=update,
        updated_replicas=counts.get(update, 0) if update else 0,
        updated_ready_replicas=sum(1 for g in members if update and g.revision == update and g.ready),
        revisions=[RevisionGroups(revision=r, groups=counts[r],
                                  ready_groups=sum(1 for g in members if g.revision == r and g.ready))
                   for r in order],
    )


def rolling(lws: dict[str, Any], status: RolloutStatus) -> bool:
    """A rollout is under way: groups on two revisions, or, once the LeaderWorkerSet was edited
    (generation > 1: a new one is starting, not rolling, even while LWS says UpdateInProgress
    as its first pods appear), it updates or has not yet seen its latest spec."""
    edited = int((lws.get("metadata") or {}).get("generation") or 0) > 1
    return len(status.revisions) > 1 or (edited and (_update_in_progress(lws) or not lws_fresh(lws)))


def figures(admitted: Admitted, status: RolloutStatus, desired: int) -> str:
    """The rollout's figures in words, e.g. ``revision 6d9f: 1/1 groups updated (0 Ready); revision
    5c7b: 1 group (1 Ready); maxSurge 1, maxUnavailable 0``."""
    r = admitted.spec.rollout
    parts = [f"revision {status.update_revision or '(not yet created)'}: {status.updated_replicas}/{desired} "
             f"groups updated ({status.updated_ready_replicas} Ready)"]
    parts += [f"revision {rev.revision}: {rev.groups} group{'s' if rev.groups != 1 else ''} ({rev.ready_groups} Ready)"
              for rev in status.revisions if rev.revision != status.update_revision]
    budget = (f"maxSurge {r.surge}, maxUnavailable {r.unavailable}" if r.unavailable is not None
              else "strategy Recreate: every group at once")
    return "; ".join(parts) + f"; {budget}"


def progressing(admitted: Admitted, lws: dict[str, Any] | None, status: RolloutStatus | None,
                desired: int) -> Verdict | None:
    """Progressing while a rollout is under way (failure case F18: True until every group runs
    the new revision; old groups never count as updated), None when none is."""
    if lws is None or status is None or not rolling(lws, status):
        return None
    if not lws_fresh(lws):
        meta = lws.get("metadata") or {}
        return Verdict("True", Reason.ROLLOUT_IN_PROGRESS,
                       f"the LeaderWorkerSet controller has not yet taken generation {meta.get('generation')} of "
                       f"{meta.get('name')}; {figures(admitted, status, desired)}")
    return Verdict("True", Reason.ROLLOUT_IN_PROGRESS, f"rolling out: {figures(admitted, status, desired)}")


def step_event(before: str | None, status: KimiK3DeploymentStatus, admitted: Admitted,
               desired: int) -> tuple[str, str] | None:
    """The Event (reason, message) of a rollout step: ``RolloutStep`` with the figures while one
    runs (a new Event each time a figure moves), ``RolloutComplete`` once it ran (``before``: the
    stored Progressing reason) and every group runs one revision. None otherwise."""
    now = status.rollout
    verdict = status.condition(ConditionType.PROGRESSING)
    if now is None or verdict is None:
        return None
    if verdict.reason == Reason.ROLLOUT_IN_PROGRESS and now.update_revision:
        return "RolloutStep", figures(admitted, now, desired)
    if before == Reason.ROLLOUT_IN_PROGRESS and verdict.reason != Reason.ROLLOUT_IN_PROGRESS \
            and len(now.revisions) == 1:
        return "RolloutComplete", (f"every group runs revision {now.update_revision}: "
                                   f"{now.updated_ready_replicas}/{desired} Ready")
    return None
