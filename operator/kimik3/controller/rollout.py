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

import copy
import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Reason, Verdict
from kimik3.api.v1alpha1 import (CanaryStatus, KimiK3DeploymentStatus, RevisionGroups, RollbackStatus,
                                 RolloutSpec, RolloutStatus)
from kimik3.controller.canary import Analysis
from kimik3.kube.labels import LWS_REVISION_LABEL
from kimik3.kube.pods import group_index, is_leader, is_ready, is_unschedulable, labels, unschedulable_message
from kimik3.kube.workloads import waiting
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION, rollout_strategy

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


def update_in_progress(lws: dict[str, Any]) -> bool:
    """The LeaderWorkerSet says UpdateInProgress: groups below replicas (and at or above the
    partition) are not all on its newest revision."""
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
    return len(status.revisions) > 1 or (edited and (update_in_progress(lws) or not lws_fresh(lws)))


ROLLING_REASONS = (Reason.ROLLOUT_IN_PROGRESS, Reason.CANARY_ANALYSIS, Reason.SURGE_BLOCKED, Reason.PAUSED)
"""Progressing reasons of a rollout under way."""


def scale_down_held(progressing_reason: str | None, lws: dict[str, Any] | None, replicas: int,
                    max_replicas: int) -> int | None:
    """The groups to keep when the autoscaler wants fewer (``replicas``) while a rollout runs
    (the stored Progressing reason is one of ``ROLLING_REASONS``): old groups are not scaled down
    mid-rollout for lack of load (the load they lack is partly on surge groups still loading, and
    LWS would take the groups it replaces next), but never more than ``max_replicas``
    (spec.autoscaling.maxReplicas: a lower bound set mid-rollout takes effect). None: no hold. A
    scale-up goes ahead."""
    current = int(((lws or {}).get("spec") or {}).get("replicas", 0) or 0)
    keep = min(current, max_replicas)
    return keep if progressing_reason in ROLLING_REASONS and replicas < keep else None


def surge_blocked(pods: list[dict[str, Any]], workloads: list[dict[str, Any]] | None, replicas: int) -> str | None:
    """Why a surge group (index >= ``replicas``, which holds the new revision beside every old
    group) cannot be placed: a pod of it the scheduler finds no room for (exclusive placement: no
    rack free), or under placement kueue its Workload not admitted (Kueue's message quoted);
    None when every surge group is placed."""
    for w in map(waiting, workloads or []):
        if w is not None and w.group.isdigit() and int(w.group) >= replicas:
            return f"surge group {w.group} is not admitted by Kueue ({w.why}): {w.message}"
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        index = group_index(pod)
        if index is not None and index.isdigit() and int(index) >= replicas and is_unschedulable(pod):
            return (f"surge group {index} cannot be placed (no rack has room for it): pod {pod['metadata']['name']}: "
                    f"{unschedulable_message(pod) or 'Unschedulable'}")
    return None


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
                desired: int, blocked: str | None = None) -> Verdict | None:
    """Progressing while a rollout is under way (failure case F18: True until every group runs
    the new revision; old groups never count as updated), None when none is. ``blocked``
    (``surge_blocked``): the surge group waits for room, so no old group goes (SurgeBlocked)."""
    if lws is None or status is None or not rolling(lws, status):
        return None
    if blocked and admitted.spec.rollout.unavailable == 0:
        return Verdict("True", Reason.SURGE_BLOCKED,
                       f"{blocked}; no old group is taken down (maxUnavailable 0) and the rollout goes on once it "
                       f"is placed; {figures(admitted, status, desired)}")
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


# ---------------------------------------------------------------- what the rollout asks of the LeaderWorkerSet


@dataclass
class RolloutStep:
    """What one reconcile does about a rollout: the LeaderWorkerSet to apply, what the status keeps."""

    lws: dict[str, Any]
    """The rendered LeaderWorkerSet, with the partition, surge and templates the rollout holds."""
    canary: CanaryStatus | None = None
    rolled_back: RollbackStatus | None = None
    verdict: Verdict | None = None
    """Progressing as the rollout says it (CanaryAnalysis, Paused, RolledBack), or None."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message)."""
    requeue_after: float | None = None


def _hash(lws: dict[str, Any] | None) -> str | None:
    return (((lws or {}).get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)


def _hold(lws: dict[str, Any], template: dict[str, Any], template_hash: str | None) -> None:
    """Keep ``template`` (the one the groups run) on ``lws`` instead of the rendered one."""
    lws["spec"]["leaderWorkerTemplate"] = copy.deepcopy(template)
    if template_hash:
        lws["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] = template_hash


def _hold_groups(lws: dict[str, Any], admitted: Admitted, surge: int | None = None) -> None:
    """No group below replicas is replaced (partition = replicas); ``surge`` canary groups."""
    replicas = int(lws["spec"]["replicas"])
    lws["spec"]["rolloutStrategy"] = rollout_strategy(admitted.spec.rollout, replicas, replicas)
    if surge is not None:
        lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = surge


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(value: str | None) -> float | None:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp() \
        if value else None


class Rollouts:
    """Pause, canary bake and analysis, rollback: what ``spec.rollout`` asks beyond the
    LeaderWorkerSet's own surge. Level-based: what it must remember between reconciles (the
    canary's checks, the templates a rollback restores, a rollback in force) is in
    ``status.rollout``; a restarted operator renders the same LeaderWorkerSet from it (F16)."""

    def __init__(self, analysis: Analysis, clock: Callable[[], float] = time.time):
        self.analysis = analysis
        self.clock = clock

    def step(self, obj: dict[str, Any], admitted: Admitted, rendered: dict[str, Any], live: dict[str, Any] | None,
             pods: list[dict[str, Any]]) -> RolloutStep:
        """What to apply for the rendered LeaderWorkerSet ``rendered``, given the ``live`` one and its pods."""
        stored = (obj.get("status") or {}).get("rollout") or {}
        canary = CanaryStatus.model_validate(stored["canary"]) if stored.get("canary") else None
        rolled_back = RollbackStatus.model_validate(stored["rolledBack"]) if stored.get("rolledBack") else None
        lws = copy.deepcopy(rendered)
        step = RolloutStep(lws)
        desired, current = _hash(rendered), _hash(live)
        r = admitted.spec.rollout
        if live is None:
            return step
        if rolled_back is not None and rolled_back.template_hash == desired:
            _hold(lws, live["spec"]["leaderWorkerTemplate"], current)
            step.rolled_back = rolled_back
            step.verdict = Verdict("False", Reason.ROLLED_BACK, rolled_back.message)
            return step
        if r.paused:
            if current != desired:
                _hold(lws, live["spec"]["leaderWorkerTemplate"], current)
            _hold_groups(lws, admitted)
            step.verdict = Verdict("True", Reason.PAUSED, "spec.rollout.paused: no group is replaced" + (
                "; a change of the group templates waits" if current != desired else ""))
            return step
        if r.canary is None:
            return step
        if canary is None or canary.template_hash != desired:
            if current == desired:
                return step  # no template change
            canary = CanaryStatus(template_hash=desired or "", previous_template=json.dumps(
                live["spec"]["leaderWorkerTemplate"], sort_keys=True), previous_template_hash=current)
            step.events.append(("Normal", "CanaryStarted", f"{r.canary.groups} canary group(s) of the new templates "
                                f"beside every old group; bake {r.canary.bake} once Ready"))
        if canary.promoted:
            step.canary = canary
            return step
        return self._bake(obj, admitted, lws, live, pods, canary, step)

    def _bake(self, obj: dict[str, Any], admitted: Admitted, lws: dict[str, Any], live: dict[str, Any],
              pods: list[dict[str, Any]], canary: CanaryStatus, step: RolloutStep) -> RolloutStep:
        r, seconds = admitted.spec.rollout, admitted.seconds
        assert r.canary is not None and seconds.canary_interval is not None and seconds.canary_bake is not None
        now = self.clock()
        replicas = int(lws["spec"]["replicas"])
        _hold_groups(lws, admitted, surge=r.canary.groups)
        members = groups(pods, admitted.plan.nodes_per_group)
        below = {g.revision for g in members if g.index < replicas and g.revision}
        surge = [g for g in members if g.index >= replicas and g.revision and g.revision not in below]
        revisions = {g.revision for g in surge}
        canary.revision = next(iter(revisions)) if len(revisions) == 1 else canary.revision
        ready = len(surge) >= r.canary.groups and all(g.ready for g in surge) and len(revisions) == 1
        if ready and canary.ready_since is None:
            canary.ready_since = _iso(now)
        since = _seconds(canary.ready_since)
        last = _seconds(canary.last_check)
        meta = obj["metadata"]
        if since is not None and canary.revision and (last is None or now - last >= seconds.canary_interval):
            check = self.analysis.check(meta["namespace"], meta["name"], admitted, canary.revision, pods)
            canary.last_check, canary.message = _iso(now), check.message
            if check.passed is not None:
                canary.checks += 1
                canary.failed_checks += 0 if check.passed else 1
                canary.latency_seconds, canary.error_rate = check.latency_seconds, check.error_rate
        if canary.failed_checks >= r.canary.analysis.failure_limit:
            return self._roll_back(r, lws, live, canary, step, now, next(iter(below), None))
        if since is not None and now - since >= seconds.canary_bake:
            canary.promoted = True
            lws["spec"]["rolloutStrategy"] = rollout_strategy(r, replicas)
            step.events.append(("Normal", "CanaryPromoted", f"revision {canary.revision} baked {r.canary.bake}: "
                                f"{canary.checks} check(s), {canary.failed_checks} failed; {canary.message}; "
                                "rolling out to every group"))
            step.canary = canary
            return step
        waiting = ("waiting for the canary group(s) to be Ready" if since is None else
                   f"baking {now - since:.0f}/{seconds.canary_bake:.0f} s: {canary.checks} check(s), "
                   f"{canary.failed_checks} failed (rollback at {r.canary.analysis.failure_limit})"
                   + (f"; {canary.message}" if canary.message else ""))
        step.canary = canary
        step.verdict = Verdict("True", Reason.CANARY_ANALYSIS, f"canary revision {canary.revision or '(not yet created)'}"
                               f" on {len(surge)}/{r.canary.groups} surge group(s) beside every old group; {waiting}")
        step.requeue_after = seconds.canary_interval
        return step

    @staticmethod
    def _roll_back(r: RolloutSpec, lws: dict[str, Any], live: dict[str, Any], canary: CanaryStatus,
                   step: RolloutStep, now: float, restored: str | None) -> RolloutStep:
        """The templates before the change go back on the LeaderWorkerSet: its revision is then
        the old groups' again, so LWS deletes the canary groups and restarts no old group."""
        previous = json.loads(canary.previous_template) if canary.previous_template else \
            live["spec"]["leaderWorkerTemplate"]
        _hold(lws, previous, canary.previous_template_hash)
        lws["spec"]["rolloutStrategy"] = rollout_strategy(r, int(lws["spec"]["replicas"]))
        message = (f"revision {canary.revision} rolled back to {restored} after {canary.failed_checks} failed check(s) of "
                   f"{canary.checks}: {canary.message}; the previous templates are back (the canary groups go, "
                   "no old group restarts); edit the spec to roll out again")
        step.rolled_back = RollbackStatus(template_hash=canary.template_hash, revision=canary.revision,
                                          restored_revision=restored, time=_iso(now), message=message)
        step.verdict = Verdict("False", Reason.ROLLED_BACK, message)
        step.events.append(("Warning", "RolledBack", message))
        return step
