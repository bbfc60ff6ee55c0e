"""Where a rollout of the engine groups' templates stands, and what it asks of the deployment's
LeaderWorkerSets (one per revision: ``controller.fleet``).

Read off the LeaderWorkerSets and their pods:
- a group is (LeaderWorkerSet, index) (``kube.groups.Group``, derived once per reconcile); its
  revision is its leader pod's ``leaderworkerset.sigs.k8s.io/template-revision-hash`` label, and it
  is Ready when all ``nodes_per_group`` of its live pods are (``kube.pods.is_ready``);
- the update revision is the target set's (the one running the spec's templates), the current
  revision the oldest old set's (the target's once no old set is left);
- a rollout is under way while more than one LeaderWorkerSet is live.

Pure functions and ``Rollouts`` (pause, canary bake and analysis with its evidence, the progress
deadline, rollback): no API calls.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Event, EventReason, Reason, Verdict, event_reason
from kimik3.api.v1alpha1 import (CHECKS_KEPT, CanaryCheck, CanaryStatus, KimiK3DeploymentStatus, ParityStatus,
                                 ProgressStatus, RevisionGroups, RollbackStatus, RolloutStatus)
from kimik3.controller import metrics
from kimik3.controller.canary import Analysis
from kimik3.controller.completions import leader_url
from kimik3.controller.fleet import EngineSet, FleetPlan, plan
from kimik3.controller.launchers import launch_plan
from kimik3.controller.parity import skip_reason
from kimik3.controller.waits import waiting_for
from kimik3.kube.groups import Group, GroupKey
from kimik3.kube.labels import KUEUE_JOB_UID_LABEL, LWS_NAME_LABEL
from kimik3.kube.pods import group_index, is_leader, is_unschedulable, labels, phase, unschedulable_message
from kimik3.kube.times import rfc3339, rfc3339_seconds
from kimik3.kube.workloads import waiting
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION


def live_groups(groups: Mapping[GroupKey, Group]) -> list[Group]:
    """The groups that still have a pod not terminating (one whose pods all terminate is gone: a
    retired LeaderWorkerSet's), by LeaderWorkerSet and index; the rollout reads each one's
    ``live_ready``."""
    return [g for g in groups.values() if g.live]


def live(sets: list[EngineSet]) -> list[EngineSet]:
    return [s for s in sets if not s.deleting]


def rollout_status(sets: list[EngineSet], target: EngineSet | None, groups: Mapping[GroupKey, Group]) -> RolloutStatus:
    """``status.rollout`` of the deployment's ``sets`` and their ``groups`` (see the module)."""
    members = live_groups(groups)

    def revision_of(name: str | None) -> str | None:
        return next((g.revision for g in members if g.leader_worker_set == name and g.revision), None)

    counts = Counter(g.revision for g in members if g.revision)
    update = revision_of(target.name) if target is not None else None
    olds = [s for s in live(sets) if target is None or s.name != target.name]
    current = next((r for r in map(revision_of, (s.name for s in olds)) if r), None) or update
    mine = [g for g in members if target is not None and g.leader_worker_set == target.name]
    order = sorted(counts, key=lambda r: (r != update, r != current, r))
    return RolloutStatus(
        current_revision=current,
        update_revision=update,
        updated_replicas=len(mine),
        updated_ready_replicas=sum(1 for g in mine if g.live_ready),
        revisions=[RevisionGroups(revision=r, groups=counts[r],
                                  ready_groups=sum(1 for g in members if g.revision == r and g.live_ready))
                   for r in order],
    )


def rolling(sets: list[EngineSet]) -> bool:
    """A rollout is under way: more than one LeaderWorkerSet of the deployment is live."""
    return len(live(sets)) > 1


ROLLING_REASONS = (Reason.ROLLOUT_IN_PROGRESS, Reason.CANARY_ANALYSIS, Reason.SURGE_BLOCKED, Reason.PAUSED,
                   Reason.METRIC_SOURCE_UNREADABLE)
"""Progressing reasons of a rollout under way."""


def scale_down_held(progressing_reason: str | None, current: int, replicas: int, max_replicas: int) -> int | None:
    """The groups to keep when the autoscaler wants fewer (``replicas``) than the fleet's
    ``current`` replicas while a rollout runs (the stored Progressing reason is one of
    ``ROLLING_REASONS``): old groups are not scaled down mid-rollout for lack of load (the load
    they lack is partly on target groups still loading), but never more than ``max_replicas``
    (spec.autoscaling.maxReplicas: a lower bound set mid-rollout takes effect). None: no hold. A
    scale-up goes ahead."""
    keep = min(current, max_replicas)
    return keep if progressing_reason in ROLLING_REASONS and replicas < keep else None


def surge_blocked(pods: list[dict[str, Any]], workloads: list[dict[str, Any]] | None,
                  target: EngineSet | None) -> str | None:
    """Why a group of the ``target`` set (which holds the new revision beside every old group)
    cannot be placed: a pod of it the scheduler finds no room for (exclusive placement: no rack
    free), or under placement kueue its Workload not admitted (Kueue's message quoted); None when
    every target group is placed."""
    if target is None:
        return None
    uid = target.lws["metadata"].get("uid")
    for workload in workloads or []:
        w = waiting(workload)
        if w is not None and uid and (workload["metadata"].get("labels") or {}).get(KUEUE_JOB_UID_LABEL) == uid:
            return f"group {w.group} of {target.name} is not admitted by Kueue ({w.why}): {w.message}"
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if labels(pod).get(LWS_NAME_LABEL) == target.name and is_unschedulable(pod):
            return (f"group {group_index(pod)} of {target.name} cannot be placed (no rack has room for it): pod "
                    f"{pod['metadata']['name']}: {unschedulable_message(pod) or 'Unschedulable'}")
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


def progressing(admitted: Admitted, sets: list[EngineSet], status: RolloutStatus | None,
                desired: int, blocked: str | None = None) -> Verdict | None:
    """Progressing while a rollout is under way (failure case F18: True until every group runs
    the new revision; old groups never count as updated), None when none is. ``blocked``
    (``surge_blocked``): a target group waits for room, so no serving old group goes (SurgeBlocked);
    old groups that are not Ready give their place (``fleet.sizes`` ``make_room``)."""
    if status is None or not rolling(sets):
        return None
    if blocked and admitted.spec.rollout.unavailable == 0:
        return Verdict("True", Reason.SURGE_BLOCKED,
                       f"{blocked}; no old group is taken down (maxUnavailable 0) while it serves (an old group that "
                       f"is not Ready gives its place) and the rollout goes on once it is placed; "
                       f"{figures(admitted, status, desired)}")
    return Verdict("True", Reason.ROLLOUT_IN_PROGRESS, f"rolling out: {figures(admitted, status, desired)}")


def step_event(status: KimiK3DeploymentStatus, admitted: Admitted, desired: int) -> tuple[EventReason, str] | None:
    """The Event (reason, message) of a rollout step: ``RolloutStep`` with the figures while one
    runs (a new Event each time a figure moves); None otherwise. ``RolloutComplete`` is posted
    when the last old LeaderWorkerSet is deleted (``controller.fleet.FleetPlan.complete``)."""
    now = status.rollout
    verdict = status.condition(ConditionType.PROGRESSING)
    if now is None or verdict is None:
        return None
    if verdict.reason == Reason.ROLLOUT_IN_PROGRESS and now.update_revision:
        return EventReason.ROLLOUT_STEP, figures(admitted, now, desired)
    return None


def source_unreadable(canary: CanaryStatus) -> bool:
    """The canary's last check could not read the metric source (the rollout is paused)."""
    return bool(canary.history) and canary.history[-1].result == "SourceUnreadable"


def bake_verdict(admitted: Admitted, canary: CanaryStatus, members: int, baked_s: float | None) -> Verdict | None:
    """Progressing while the canary (on ``members`` groups, Ready for ``baked_s`` seconds, None
    while not all are) bakes; None once it may be promoted: baked ``canary.bake``, at least
    ``analysis.minChecks`` passing checks, one passing output-parity round (or parity skipped:
    ``controller.parity``), and the metric source read at the last check. A source
    that cannot be read pauses the rollout: ``Progressing=False MetricSourceUnreadable``."""
    r = admitted.spec.rollout
    assert r.canary is not None and admitted.seconds.canary_bake is not None
    bake, need = admitted.seconds.canary_bake, r.canary.analysis.min_checks
    passed = canary.checks - canary.failed_checks
    evidence = (f"{passed}/{need} passing check(s) (analysis.minChecks), {canary.failed_checks} failed (rollback at "
                f"{r.canary.analysis.failure_limit})")
    where = (f"canary revision {canary.revision or '(not yet created)'} on {members}/{r.canary.groups} canary "
             "group(s) beside every old group")
    if baked_s is not None and source_unreadable(canary):
        return Verdict("False", Reason.METRIC_SOURCE_UNREADABLE,
                       f"{where}; the canary analysis is paused: {canary.message}; the revision is not promoted and "
                       f"no old group is replaced until the source reads again; {evidence}")
    parity = canary.parity
    if parity is None:
        parity_evidence = "output parity not yet compared"
    elif parity.result == "Skipped":
        parity_evidence = parity.message
    else:
        parity_evidence = f"{parity.passed_rounds} passing parity round(s) of {parity.rounds}: {parity.message}"
    parity_held = parity is not None and (parity.result == "Skipped" or parity.passed_rounds >= 1)
    evidence += f"; {parity_evidence}"
    if baked_s is not None and baked_s >= bake and passed >= need and parity_held:
        return None
    if baked_s is None:
        waiting_for = "waiting for the canary group(s) to be Ready"
    elif baked_s >= bake:
        waiting_for = (f"baked {baked_s:.0f}/{bake:.0f} s but {evidence}: the bake goes on until it has them "
                       "(a window without traffic judges nothing)")
    else:
        waiting_for = f"baking {baked_s:.0f}/{bake:.0f} s: {evidence}"
    return Verdict("True", Reason.CANARY_ANALYSIS, f"{where}; {waiting_for}"
                   + (f"; {canary.message}" if canary.message else ""))


# ---------------------------------------------------------------- what the rollout asks of the LeaderWorkerSets


@dataclass
class RolloutStep:
    """What one reconcile does about a rollout: the LeaderWorkerSets to apply and delete, what the status keeps."""

    fleet: FleetPlan
    canary: CanaryStatus | None = None
    rolled_back: RollbackStatus | None = None
    progress: ProgressStatus | None = None
    """While a rollout runs: its last progress (``status.rollout.progress``)."""
    verdict: Verdict | None = None
    """Progressing as the rollout says it (CanaryAnalysis, Paused, RolledBack), or None."""
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


def _hash(lws: dict[str, Any]) -> str | None:
    return ((lws.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)


def _budget(admitted: Admitted, replicas: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in groups; Recreate: (0, replicas)."""
    r = admitted.spec.rollout
    return (r.surge, r.unavailable) if r.unavailable is not None else (0, replicas)


class Rollouts:
    """Surge, pause, canary bake and analysis, rollback over the deployment's LeaderWorkerSets
    (``controller.fleet``). Level-based: what it must remember between reconciles (the canary's
    checks, a rollback in force) is in ``status.rollout``, the rest in the LeaderWorkerSets
    themselves; a restarted operator plans the same sets (F16)."""

    def __init__(self, analysis: Analysis, clock: Callable[[], float] = time.time):
        self.analysis = analysis
        self.clock = clock

    def step(self, obj: dict[str, Any], admitted: Admitted, rendered: dict[str, Any], sets: list[EngineSet],
             groups: Mapping[GroupKey, Group], workloads: list[dict[str, Any]] | None = None,
             launchers: Sequence[dict[str, Any]] = ()) -> RolloutStep:
        """The LeaderWorkerSets to apply and delete for the rendered one ``rendered`` (base name,
        the spec's templates and replicas), given the deployment's ``sets``, their ``groups``,
        under placement kueue their ``workloads`` (a target group Kueue does not admit has no room)
        and its launcher ConfigMaps ``launchers`` (each set's launch plan: what output parity
        compares, ``controller.parity``)."""
        stored = (obj.get("status") or {}).get("rollout") or {}
        rolled_back = RollbackStatus.model_validate(stored["rolledBack"]) if stored.get("rolledBack") else None
        replicas = int(rendered["spec"]["replicas"])
        surge, unavailable = _budget(admitted, replicas)
        want, r = _hash(rendered), admitted.spec.rollout
        running = live(sets)
        changing = bool(running) and (len(running) > 1 or running[-1].template_hash != want)
        if rolled_back is not None and rolled_back.template_hash == want:
            step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, refused=want),
                               rolled_back=rolled_back)
            step.verdict = Verdict("False", Reason(rolled_back.reason), rolled_back.message)
            return step
        if r.paused:
            step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, paused=True))
            waits = changing and not any(s.template_hash == want for s in running)
            step.verdict = Verdict("True", Reason.PAUSED, "spec.rollout.paused: no group is replaced" + (
                "; a change of the group templates waits" if waits else ""))
            return step
        if not changing or any(s.template_hash == want for s in running[:-1]):  # a revert to serving templates
            return RolloutStep(plan(rendered, sets, replicas, surge, unavailable))  # needs no canary, no deadline
        target = next((s for s in reversed(running) if s.template_hash == want), None)
        room = surge_blocked([p for g in groups.values() for p in g.pods], workloads, target) is not None
        step = self._change(obj, admitted, rendered, sets, groups, room, launchers)
        progress = ProgressStatus.model_validate(stored["progress"]) if stored.get("progress") else None
        return step if step.rolled_back is not None else self._deadline(admitted, rendered, sets, groups, step,
                                                                        progress)

    def _change(self, obj: dict[str, Any], admitted: Admitted, rendered: dict[str, Any], sets: list[EngineSet],
                groups: Mapping[GroupKey, Group], make_room: bool, launchers: Sequence[dict[str, Any]]) -> RolloutStep:
        """A change of the templates rolling out: surge, or a canary that bakes before it is
        promoted; ``make_room``: a new group has no room, old groups not Ready give theirs up."""
        stored = (obj.get("status") or {}).get("rollout") or {}
        canary = CanaryStatus.model_validate(stored["canary"]) if stored.get("canary") else None
        replicas = int(rendered["spec"]["replicas"])
        surge, unavailable = _budget(admitted, replicas)
        want, r = _hash(rendered), admitted.spec.rollout
        if r.canary is None:
            return RolloutStep(plan(rendered, sets, replicas, surge, unavailable, make_room=make_room))
        if canary is None or canary.template_hash != want:
            canary = CanaryStatus(template_hash=want or "")
            step_events = [Event("Normal", EventReason.CANARY_STARTED, f"{r.canary.groups} canary group(s) of the new "
                                 f"templates beside every old group; bake {r.canary.bake} once Ready")]
        else:
            step_events = []
        if canary.promoted:
            step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, make_room=make_room), canary=canary)
        else:
            step = self._bake(obj, admitted, rendered, sets, groups, canary, make_room, launchers)
        step.events = step_events + step.events
        return step

    def _deadline(self, admitted: Admitted, rendered: dict[str, Any], sets: list[EngineSet],
                  groups: Mapping[GroupKey, Group], step: RolloutStep, stored: ProgressStatus | None) -> RolloutStep:
        """``step`` with the rollout's progress (``ProgressStatus``: reset when a group of the new
        templates turns Ready or more are asked for); rolled back (ProgressDeadlineExceeded, what the
        groups wait on quoted: ``controller.waits``) when some are not Ready
        ``Seconds.progress_deadline`` after it, while an old LeaderWorkerSet is there to go back to."""
        want, now, deadline = _hash(rendered) or "", self.clock(), admitted.seconds.progress_deadline
        target = next((s for s in reversed(live(sets)) if s.template_hash == want), None)
        if target is None or not rolling(sets):
            return step
        members = [g for g in live_groups(groups) if g.leader_worker_set == target.name and g.index < target.replicas]
        ready = sum(1 for g in members if g.live_ready)
        moved = stored is None or (stored.template_hash, stored.groups) != (want, target.replicas)
        step.progress = (ProgressStatus(template_hash=want, groups=target.replicas, ready_groups=ready, since=rfc3339(now))
                         if moved or stored is None or ready > stored.ready_groups
                         else stored.model_copy(update={"ready_groups": ready}))
        left = (rfc3339_seconds(step.progress.since) or now) + deadline - now
        if ready >= target.replicas or left > 0:
            if ready < target.replicas:
                step.requeue_after = min(left, step.requeue_after if step.requeue_after is not None else left)
            return step
        revision = next((g.revision for g in members if g.revision), None)
        waits = waiting_for([p for g in members for p in g.live], admitted, target.replicas)
        why = (f"at its progress deadline: {target.replicas - ready} of {target.replicas} group(s) of {target.name} not Ready "
               f"{deadline:.0f} s after the rollout last progressed (rollout.progressDeadline"
               f"{' ' + admitted.spec.rollout.progress_deadline if admitted.spec.rollout.progress_deadline else ''}"
               f"{'' if admitted.spec.rollout.progress_deadline else ': probes.loadTimeout + 10m'}): "
               f"{waits or 'waiting for the LeaderWorkerSet to create them'}")
        return self._roll_back(rendered, sets, groups, admitted, want, revision, now,
                               Reason.PROGRESS_DEADLINE_EXCEEDED, why)

    def _bake(self, obj: dict[str, Any], admitted: Admitted, rendered: dict[str, Any], sets: list[EngineSet],
              groups: Mapping[GroupKey, Group], canary: CanaryStatus, make_room: bool,
              launchers: Sequence[dict[str, Any]]) -> RolloutStep:
        r, seconds = admitted.spec.rollout, admitted.seconds
        assert r.canary is not None and seconds.canary_interval is not None and seconds.canary_bake is not None
        now = self.clock()
        replicas = int(rendered["spec"]["replicas"])
        surge, unavailable = _budget(admitted, replicas)
        target = next((s for s in reversed(live(sets)) if s.template_hash == _hash(rendered)), None)
        members = [g for g in live_groups(groups)
                   if target is not None and g.leader_worker_set == target.name and g.index < target.replicas]
        revisions = {g.revision for g in members if g.revision}
        canary.revision = next(iter(revisions)) if len(revisions) == 1 else canary.revision
        ready = len(members) >= r.canary.groups and all(g.live_ready for g in members) and len(revisions) == 1
        if ready and canary.ready_since is None:
            canary.ready_since = rfc3339(now)
        since = rfc3339_seconds(canary.ready_since)
        last = rfc3339_seconds(canary.last_check)
        events = []
        if since is not None and canary.revision and (last is None or now - last >= seconds.canary_interval):
            events = self._check(obj, admitted, canary, groups, now)
            if target is not None:
                self._parity(obj, admitted, canary, sets, groups, target, launchers)
        if canary.parity is not None and canary.parity.result == "Failed":
            return self._roll_back(rendered, sets, groups, admitted, canary.template_hash, canary.revision, now,
                                   Reason.ROLLED_BACK, f"by {canary.parity.message}")
        if canary.failed_checks >= r.canary.analysis.failure_limit:
            return self._roll_back(rendered, sets, groups, admitted, canary.template_hash, canary.revision, now,
                                   Reason.ROLLED_BACK, f"after {canary.failed_checks} failed check(s) of {canary.checks}: "
                                   f"{canary.message}")
        verdict = bake_verdict(admitted, canary, len(members), None if since is None else now - since)
        if verdict is None:
            canary.promoted = True
            step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, make_room=make_room), canary=canary)
            parity = f"; {canary.parity.message}" if canary.parity is not None else ""
            step.events.append(Event("Normal", EventReason.CANARY_PROMOTED, f"revision {canary.revision} baked "
                                     f"{r.canary.bake}: {canary.checks} check(s), {canary.failed_checks} failed; "
                                     f"{canary.message}{parity}; rolling out to every group"))
            return step
        step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, canary=r.canary.groups,
                                make_room=make_room), canary=canary,
                           verdict=verdict, events=events)
        step.requeue_after = seconds.canary_interval
        return step

    def _check(self, obj: dict[str, Any], admitted: Admitted, canary: CanaryStatus, groups: Mapping[GroupKey, Group],
               now: float) -> list[Event]:
        """One analysis check of the canary's revision, kept in ``canary`` (counts, the last
        figures, the history of the last ``CHECKS_KEPT``); a Warning Event when the source
        cannot be read."""
        meta = obj["metadata"]
        assert canary.revision is not None
        check = self.analysis.check(meta["namespace"], meta["name"], admitted, canary.revision,
                                    [p for g in groups.values() for p in g.pods])
        canary.last_check, canary.message = rfc3339(now), check.message
        metrics.CANARY_CHECKS.labels(meta["namespace"], meta["name"], check.result).inc()
        canary.history = [*canary.history, CanaryCheck(time=canary.last_check, result=check.result,
                                                       latency_seconds=check.latency_seconds,
                                                       error_rate=check.error_rate, requests=check.requests,
                                                       message=check.message[:1024])][-CHECKS_KEPT:]
        if check.judged:
            canary.checks += 1
            canary.failed_checks += 0 if check.result == "Passed" else 1
            canary.latency_seconds, canary.error_rate = check.latency_seconds, check.error_rate
        if check.result == "NoTraffic":
            canary.probing = True
        if canary.probing:
            mine = [g for g in groups.values() if g.revision == canary.revision]
            leaders = [url for _, url in self._leaders(admitted, mine)]
            canary.probe_requests += self.analysis.probe(meta["namespace"], meta["name"], admitted, leaders)
        if check.result == "SourceUnreadable":
            return [Event("Warning", EventReason.METRIC_SOURCE_UNREADABLE, f"canary analysis paused: {check.message}")]
        return []

    def _leaders(self, admitted: Admitted, groups: Sequence[Group]) -> list[tuple[str, str]]:
        """(leader pod name, API base URL) of each of ``groups`` that is Ready, its leader Running
        (addressed as the pod scrape addresses it: ``Analysis.scrape_url``)."""
        port = admitted.spec.service.port
        return [(p["metadata"]["name"], leader_url(self.analysis.scrape_url(p, port)))
                for g in groups if g.live_ready
                for p in [next((p for p in g.live if is_leader(p) and phase(p) == "Running"), None)] if p is not None]

    def _parity(self, obj: dict[str, Any], admitted: Admitted, canary: CanaryStatus, sets: list[EngineSet],
                groups: Mapping[GroupKey, Group], target: EngineSet, launchers: Sequence[dict[str, Any]]) -> None:
        """One output-parity round (``controller.parity``) of the canary groups of ``target``
        against a Ready group of the newest old set, kept in ``canary.parity``."""
        meta = obj["metadata"]
        olds = [s for s in live(sets) if s.name != target.name]
        members = live_groups(groups)
        mine = self._leaders(admitted, [g for g in members if g.leader_worker_set == target.name
                                        and g.index < target.replicas])
        old_set, old = next(((s, leader) for s in reversed(olds)
                             for leader in self._leaders(admitted, [g for g in members if g.leader_worker_set == s.name])),
                            (olds[-1] if olds else None, None))
        held = canary.parity or ParityStatus(result="Unanswered")
        why = skip_reason(admitted, launch_plan(target, launchers), launch_plan(old_set, launchers) if old_set else None)
        if why is not None:
            canary.parity = held.model_copy(update={"result": "Skipped", "message": why})
            return
        if not mine or old is None:
            canary.parity = held.model_copy(update={"result": "Unanswered", "message": (
                "output parity: no Ready old group to compare the canary with" if mine else
                "output parity: no Ready canary leader to ask")})
            return
        done = self.analysis.parity.round(meta["namespace"], meta["name"], admitted, mine, old)
        judged = done.result in ("Passed", "Failed")
        canary.parity = ParityStatus(
            result=done.result, rounds=held.rounds + judged, passed_rounds=held.passed_rounds + (done.result == "Passed"),
            prompts=done.prompts if judged else held.prompts,
            mismatches=len(done.mismatches) if judged else held.mismatches,
            mismatch_rate=done.rate if judged else held.mismatch_rate, max_mismatch_rate=done.max_rate,
            message=done.message[:1024])

    @staticmethod
    def _roll_back(rendered: dict[str, Any], sets: list[EngineSet], groups: Mapping[GroupKey, Group],
                   admitted: Admitted, template_hash: str, revision: str | None, now: float,
                   reason: Reason, why: str) -> RolloutStep:
        """The release of ``template_hash`` (LeaderWorkerSet revision ``revision``) is rolled back
        because ``why``: its sets drain as the newest old set's groups turn Ready (a canary's surge
        groups go at once: the old groups never stopped); none of them restarts."""
        want = _hash(rendered)
        old = [s for s in live(sets) if s.template_hash != want]
        restored = next((g.revision for g in live_groups(groups)
                         if old and g.leader_worker_set == old[-1].name and g.revision), None)
        message = (f"revision {revision} rolled back to {restored} {why}; its groups go as the restored revision's "
                   "are Ready, no old group restarts; edit the spec to roll out again")
        replicas = int(rendered["spec"]["replicas"])
        surge, unavailable = _budget(admitted, replicas)
        step = RolloutStep(plan(rendered, sets, replicas, surge, unavailable, refused=want))
        step.rolled_back = RollbackStatus(template_hash=template_hash, revision=revision, restored_revision=restored,
                                          time=rfc3339(now), reason=reason.value, message=message)
        step.verdict = Verdict("False", reason, message)
        step.events.append(Event("Warning", event_reason(reason), message))
        return step
