"""The named steps of a reconcile, each a function over one ``Snapshot`` returning a ``StepResult``.

A step decides; it does not write. What it asks for (children to apply, objects to delete,
conditions, Events, when to look again) is in its ``StepResult``, with the value the next steps
build on (``value``: the replicas, the rendered children, the rollout's plan...). The reconciler
(``controller.reconcile``) runs them in order, merges their results (``Outcome``) and does the
writes: the applies between ``roll`` and ``retire``, the deletions, the status and the Events.

    stage    weights and drafter staged before any GPU is held (``controller.staging``)
    guard    engine failures: Degraded and the launcher's start back-off (``controller.recreation``)
    idle     stopped after spec.idle.stopAfter without a request, or woken (``controller.idle``)
    scale    the replicas the autoscaler decides (``controller.autoscaling``)
    render   the children of the admitted spec (``render.children``)
    roll     the LeaderWorkerSets of the rollout: surge, canary, rollback (``controller.rollout``)
    gate     what may be applied now: no engine before the weights, no new group while Kueue
             does not serve the queue (``controller.queues``)
    -- the reconciler applies --
    retire   the LeaderWorkerSets the rollout is done with (``controller.fleet``)
    -- the reconciler reads the snapshot again (``Reader.refresh``) --
    prune    children the spec no longer needs, launcher ConfigMaps no revision mounts
    place    Kueue groups split across racks or on a failed tray, admitted again (``controller.readmit``);
             reserved and burst groups' Workload priorities (``controller.capacity``)
    observe  the ComputeDomain (``controller.computedomains``)
    route    the endpoint picker, the InferencePool's gateways, the route's Gateways (``controller.routing``)
    report   the status and its Events (``controller.status``)
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Event, EventReason, Reason, Verdict, event_reason
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus, RoutingStatus
from kimik3.controller import launchers
from kimik3.controller.autoscaling import Autoscaling, Scaled
from kimik3.controller.capacity import RECHECK_S, Priorities, Reprioritize, missing_reserved, reprioritizations
from kimik3.controller.computedomains import (SLICES_POLL_S, PrepareFailure, compute_domain_verdict, prepare_failures,
                                              unprepared_pods, verdict_event, with_prepare_failures)
from kimik3.controller.fleet import fleet_replicas
from kimik3.controller import placementmix
from kimik3.controller.queues import POLL_S as QUEUE_POLL_S
from kimik3.controller.queues import QueueRead, queue_verdict
from kimik3.controller.groups import kueue_changes, stored_groups
from kimik3.controller.idle import Idle, IdleStep
from kimik3.controller.readmit import STRANDED_AFTER_S, awaits_kueue, readmissions, stranded
from kimik3.controller.recreation import Crashes, GroupFailures
from kimik3.controller.rollout import RolloutStep, Rollouts, scale_down_held, step_event
from kimik3.controller.routing import POLL_S as GATEWAY_POLL_S
from kimik3.controller.routing import gateway_verdict, routing_status, routing_verdict
from kimik3.controller.snapshot import Snapshot
from kimik3.controller.staging import Staging, Weights, with_weights
from kimik3.controller.status import Observed, compute_status, stored_conditions
from kimik3.kube.kinds import COMPUTE_DOMAIN, CONFIG_MAP, LEADER_WORKER_SET, POD_DISRUPTION_BUDGET, WORKLOAD, Kind
from kimik3.kube.objects import is_deleting
from kimik3.render.children import Rendered, render
from kimik3.render.disruption import fleet_pods, over_fleet
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION
from kimik3.render.wake import WakeEndpoint

T = TypeVar("T")

RESYNC_READY_S = 600.0
"""Safety resync of a settled deployment: watches on every child and pod trigger the reconciles
that matter (drift, deletion, group status) within a second."""
RESYNC_STARTING_S = 120.0
"""Safety resync while groups start (pod and LeaderWorkerSet watches drive status sooner)."""
REPLACE_POLL_S = 2.0
"""Re-check this often while Kueue may be replacing a group's failed tray (``controller.readmit``), seconds."""
ANNOUNCE_S = 0.0
"""Reconcile again at once after writing WeightsReady=True, before which no engine is applied."""


class Deletion(NamedTuple):
    """An object to delete (of ``kind``, named ``name`` in the deployment's namespace; only the
    object of ``uid`` when set: a precondition), and the ``event`` that says so once it is gone."""

    kind: Kind
    name: str
    uid: str = ""
    event: Event | None = None


@dataclass
class StepResult(Generic[T]):
    """What one step asks for, and the value the next steps build on."""

    value: T
    apply: list[dict[str, Any]] = field(default_factory=list)
    """Children to server-side apply, in order."""
    delete: list[Deletion] = field(default_factory=list)
    conditions: dict[ConditionType, Verdict] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    """Reconcile again within this many seconds (None: no wish)."""


@dataclass
class Outcome:
    """The merged results of a reconcile's steps."""

    delete: list[Deletion] = field(default_factory=list)
    conditions: dict[ConditionType, Verdict] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None

    def add(self, result: StepResult[T]) -> StepResult[T]:
        """Merge ``result`` in (the earliest requeue wins) and return it."""
        self.delete += result.delete
        self.conditions.update(result.conditions)
        self.events += result.events
        if result.requeue_after is not None:
            self.requeue_after = min(result.requeue_after, self.requeue_after if self.requeue_after is not None
                                     else result.requeue_after)
        return result


# ------------------------------------------------------------------------------------------ before the applies


def stage(snap: Snapshot, admitted: Admitted, staging: Staging) -> StepResult[Weights]:
    """WeightsReady (``controller.staging``; its Jobs and claims are created there)."""
    weights = staging.step(snap.obj, admitted)
    return StepResult(weights, conditions={ConditionType.WEIGHTS_READY: weights.verdict},
                      requeue_after=weights.requeue_after)


def guard(snap: Snapshot, failures: GroupFailures) -> StepResult[Crashes]:
    """Degraded while groups keep failing; the value: the failures still charged (of live
    LeaderWorkerSets), whose start back-off ``render_children`` gives the launcher of the
    spec's templates alone (``controller.recreation``)."""
    crashes = failures.charged(snap.owner.namespace, snap.owner.name, (s.name for s in snap.sets if not s.deleting))
    verdict = crashes.verdict()
    if verdict is None:
        return StepResult(crashes)
    return StepResult(crashes, conditions={ConditionType.DEGRADED: verdict},
                      events=[Event("Warning", event_reason(verdict.reason), verdict.message)])


def idle(snap: Snapshot, admitted: Admitted, idling: Idle) -> StepResult[IdleStep]:
    """Stopped (0 groups) after spec.idle.stopAfter without a request, or woken by a request or a
    spec change; the condition Stopped and its Events (``controller.idle``)."""
    step = idling.step(snap.obj, admitted, snap.sets, snap.groups, snap.workloads)
    out = StepResult(step, events=list(step.events), requeue_after=step.requeue_after)
    if step.verdict is not None:
        out.conditions[ConditionType.STOPPED] = step.verdict
    return out


def scale(snap: Snapshot, admitted: Admitted, autoscaling: Autoscaling, stopped: bool = False) -> StepResult[Scaled | None]:
    """The autoscaler's decision (None with autoscaling off, or while ``stopped`` for idleness); a
    scale-down is held while a rollout runs."""
    if not admitted.spec.autoscaling.enabled or stopped:
        autoscaling.forget(snap.owner.namespace, snap.owner.name)
        return StepResult(None)
    scaled = autoscaling.step(snap.obj, admitted, snap.sets, snap.groups, snap.workloads)
    events = list(scaled.events)
    progress = next((c.reason for c in stored_conditions(snap.obj) if c.type == ConditionType.PROGRESSING), None)
    keep = scale_down_held(progress, fleet_replicas(snap.sets) or 0, scaled.replicas,
                           admitted.spec.autoscaling.max_replicas)
    if keep is not None:
        events.insert(0, Event("Normal", EventReason.SCALE_DOWN_HELD, f"keeping {keep} group(s), not {scaled.replicas}, "
                               "until the rollout is done"))
        scaled.replicas = keep
    return StepResult(scaled, events=events, requeue_after=scaled.requeue_after)


def render_children(snap: Snapshot, admitted: Admitted, replicas: int | None, crashes: Crashes,
                    compute_domains: bool, wake: WakeEndpoint | None = None) -> StepResult[Rendered]:
    """The children of the spec at ``replicas`` (the autoscaler's or the idle step's; None:
    spec.replicas), the HTTPRoute to ``wake`` when given (the deployment sleeps); render's warnings
    as Events. The launcher carries the start back-off its own templates' groups earned (the
    LeaderWorkerSets of the rendered template hash): a new revision starts clean."""
    rendered = render(admitted, snap.owner, replicas=replicas, compute_domains=compute_domains,
                      inference_pools=snap.pools_served, wake=wake)
    lws = next(c for c in rendered.objects if c["kind"] == LEADER_WORKER_SET.kind)
    want = lws["metadata"]["annotations"].get(TEMPLATE_HASH_ANNOTATION)
    delay = crashes.start_delay_s(s.name for s in snap.sets if s.template_hash == want and not s.deleting)
    if delay > 0:
        rendered = render(admitted, snap.owner, replicas=replicas, compute_domains=compute_domains, start_delay_s=delay,
                          inference_pools=snap.pools_served, wake=wake)
    return StepResult(rendered, events=list(rendered.warnings))


def roll(snap: Snapshot, admitted: Admitted, rendered: Rendered, rollouts: Rollouts) -> StepResult[RolloutStep]:
    """The rendered LeaderWorkerSet replaced by the rollout's sets (old ones first, the target last);
    the disruption budget counts the pods of them all (``render.disruption.over_fleet``)."""
    index = next(i for i, c in enumerate(rendered.objects) if c["kind"] == LEADER_WORKER_SET.kind)
    rolled = rollouts.step(snap.obj, admitted, rendered.objects[index], snap.sets, snap.groups, snap.workloads,
                           snap.launchers)
    replicas, pods = int(rendered.objects[index]["spec"]["replicas"]), fleet_pods(rolled.fleet.apply, snap.pods)
    objects = [over_fleet(c, admitted.spec, replicas, pods) if c["kind"] == POD_DISRUPTION_BUDGET.kind else c
               for c in rendered.objects[:index] + rolled.fleet.apply + rendered.objects[index + 1:]]
    return StepResult(rolled, apply=objects, events=list(rolled.events), requeue_after=rolled.requeue_after)


def gate(snap: Snapshot, weights: Weights, objects: list[dict[str, Any]],
         queue: QueueRead | None = None) -> StepResult[bool]:
    """No LeaderWorkerSet or ComputeDomain before the weights; and once staged, WeightsReady=True is
    written one reconcile before the first engine pod, so no reader ever sees a pod while the
    status says Staging. Under placement kueue, when the apply would create groups and ``queue``
    (the LocalQueue as read) shows Kueue does not serve it, neither either, with ScalingLimited
    saying what is missing (``controller.queues``; the status carries it). The value: whether the
    engines are held back now."""
    announcing = weights.ready and any(c.type == ConditionType.WEIGHTS_READY and c.status == "False"
                                       for c in stored_conditions(snap.obj))
    unserved = queue_verdict(queue) if queue is not None else None
    held = not weights.ready or announcing or unserved is not None
    kinds = (LEADER_WORKER_SET.kind, COMPUTE_DOMAIN.kind)
    out = StepResult(held, apply=[c for c in objects if not (held and c["kind"] in kinds)],
                     requeue_after=ANNOUNCE_S if announcing else None)
    if unserved is not None:
        out.conditions[ConditionType.SCALING_LIMITED] = unserved
        out.requeue_after = min(out.requeue_after if out.requeue_after is not None else QUEUE_POLL_S, QUEUE_POLL_S)
    return out


# ------------------------------------------------------------------------------------------ after the applies


def retire(rolled: RolloutStep, desired: int) -> StepResult[None]:
    """Delete the LeaderWorkerSets the rollout is done with; once the last old one goes, RolloutComplete."""
    fleet = rolled.fleet
    why = f"its groups are replaced by {fleet.target}'s" if fleet.target else "not needed"
    out: StepResult[None] = StepResult(None, delete=[
        Deletion(LEADER_WORKER_SET, name, event=Event("Normal", EventReason.DELETED,
                                                      f"LeaderWorkerSet {name} removed: {why}"))
        for name in fleet.delete])
    if fleet.delete and fleet.complete:
        out.events.append(Event("Normal", EventReason.ROLLOUT_COMPLETE, f"every group runs on LeaderWorkerSet {fleet.target} "
                                f"({desired} group(s) Ready); {', '.join(fleet.delete)} removed"))
    return out


def prune(snap: Snapshot, rendered: Rendered, applied_all: bool) -> StepResult[None]:
    """Delete the children the spec no longer needs (the ComputeDomain only once no pod holds its
    channel, F4) and, once the rollout settled and every child applied, the launcher ConfigMaps no
    revision with groups mounts (``controller.launchers``)."""
    owner = snap.owner
    out: StepResult[None] = StepResult(None)
    for kind, name in rendered.absent:
        if kind == COMPUTE_DOMAIN and snap.pods:
            continue  # F4: pods still hold its channel claim; deleted once they are gone
        out.delete.append(Deletion(kind, name, event=Event(
            "Normal", EventReason.DELETED, f"{kind.kind} {name} removed: not needed by the spec")))
    if applied_all and launchers.settled(snap.sets):
        configmap = next(c["metadata"]["name"] for c in rendered.objects if c["kind"] == CONFIG_MAP.kind)
        keep = launchers.in_use(configmap, snap.sets, snap.pods)
        out.delete += [Deletion(CONFIG_MAP, name, event=Event(
            "Normal", EventReason.DELETED, f"ConfigMap {name} removed: no group runs a revision that mounts it "
                                 f"(kept: {', '.join(sorted(keep))})"))
            for name in launchers.stale(owner, snap.launchers, keep)]
    return out


def place(snap: Snapshot, admitted: Admitted, now: dt.datetime) -> StepResult[list[Reprioritize]]:
    """Placement kueue: the Workload of each group Kueue split across racks or whose tray failed is
    deleted, for Kueue to admit the group again whole, and so is one Kueue set aside for a
    ResourceClaimTemplate not yet made (``controller.readmit``); with burst capacity, the value is
    the Workloads whose priority is to be set to their capacity's (``controller.capacity``). Look
    again soon while that goes on, an admitted group has a pod not yet on a tray, a Workload is set
    aside, or a reserved group's Workload is not made yet (Workloads are not watched); with burst
    capacity every ``capacity.RECHECK_S`` all the same (Kueue may set a raised priority back)."""
    workloads, names = snap.workloads or [], snap.set_uids
    steps = readmissions(workloads, snap.groups, names, now)
    gone = {s.workload for s in steps}
    priorities = snap.priorities
    out: StepResult[list[Reprioritize]] = StepResult(
        [r for r in reprioritizations(admitted.spec, workloads, names, priorities) if r.workload not in gone]
        if isinstance(priorities, Priorities) else [],
        delete=[Deletion(WORKLOAD, s.workload, s.uid, s.event) for s in steps])
    if isinstance(priorities, str):
        out.events.append(Event("Warning", EventReason.PRIORITY_CLASS_UNREADABLE,
                                f"{priorities}: the reserved groups keep the burst priority Kueue gave them "
                                "until it can be read"))
    aside = any(stranded(w, now + dt.timedelta(seconds=STRANDED_AFTER_S)) for w in workloads)
    if steps or aside or awaits_kueue(workloads, snap.pods, names) or \
            (snap.workloads is not None and missing_reserved(admitted.spec, workloads, snap.sets)):
        out.requeue_after = REPLACE_POLL_S
    elif priorities is not None:
        out.requeue_after = RECHECK_S
    return out


def observe(snap: Snapshot, has_domain: bool, now: dt.datetime) -> StepResult[list[PrepareFailure]]:
    """ComputeDomainReady of the deployment's ComputeDomain when it has one (``has_domain``: the
    spec renders one; F19), with the pods the kubelet has failed to prepare past their bound
    (F19 b) as the value; look again while a pod waits to be prepared, and every ``SLICES_POLL_S``
    while the driver's ResourceSlices are read."""
    if not has_domain:
        return StepResult([])
    failures, again = prepare_failures(snap.pods, snap.prepare_events, now) if unprepared_pods(snap.pods) \
        else ([], None)
    verdict = compute_domain_verdict(snap.compute_domain, snap.pods, failures, snap.sliced)
    if snap.sliced is not None:  # nothing the operator watches changes when a tray's slice goes
        again = SLICES_POLL_S if again is None else min(again, SLICES_POLL_S)
    out: StepResult[list[PrepareFailure]] = StepResult(failures, requeue_after=again)
    if verdict is not None:
        out.conditions[ConditionType.COMPUTE_DOMAIN_READY] = verdict
    event = verdict_event(verdict)
    if event is not None:
        out.events.append(event)
    return out


def route(snap: Snapshot, admitted: Admitted) -> StepResult[RoutingStatus | None]:
    """RoutingReady (with ``spec.routing``) and GatewayReady (with ``spec.service.httpRoute``), and
    ``status.routing`` as the value (``controller.routing``); look again every ``GATEWAY_POLL_S``
    while a Gateway does not admit the route (Gateways are not watched)."""
    spec, owner = admitted.spec, snap.owner
    reported = bool((snap.obj.get("status") or {}).get("routing"))
    out: StepResult[RoutingStatus | None] = StepResult(routing_status(spec, owner, snap.pools_served, snap.pool,
                                                                      reported))
    routing = routing_verdict(spec, owner, snap.pools_served, snap.picker, snap.pool, snap.objectives_served)
    gateway = gateway_verdict(owner.namespace, snap.gateways)
    if routing is not None:
        out.conditions[ConditionType.ROUTING_READY] = routing
    if gateway is not None:
        out.conditions[ConditionType.GATEWAY_READY] = gateway
        if gateway.status != "True":
            out.requeue_after = GATEWAY_POLL_S
    return out


def collide(snap: Snapshot, admitted: Admitted,
            placements: placementmix.Placements) -> StepResult[list[tuple[str, str]]]:
    """PlacementConflict when a deployment of the other placement mode shares the node pool
    (``controller.placementmix``: each named, a Warning Event), False once a clash written
    before is gone; nothing when the deployments cannot be read or none ever clashed. The value:
    the other deployments (namespace, name) whose condition does not say (or no longer says) the
    clash with this one, to reconcile too."""
    if snap.deployments is None:
        return StepResult([])
    placements.forget(snap.deployments)
    me = placementmix.placement(snap.owner.namespace, snap.owner.name, admitted, snap.racks.values())
    others = [(obj, p) for obj in snap.deployments if not is_deleting(obj)
              and (p := placements.of(obj)) is not None and p.ref != me.ref]
    found = placementmix.clashes(me, (p for _, p in others))
    stale = [(p.namespace, p.name) for obj, p in others if (p in found) != placementmix.names(obj, me)]
    if not found and not any(c.type == ConditionType.PLACEMENT_CONFLICT for c in stored_conditions(snap.obj)):
        return StepResult(stale)
    out = StepResult(stale, conditions={ConditionType.PLACEMENT_CONFLICT: placementmix.verdict(me, found)})
    if found:
        out.events.append(Event("Warning", EventReason.PLACEMENT_MODES_MIXED, placementmix.event_message(me, found)))
    return out


def report(snap: Snapshot, admitted: Admitted, observed: Observed, weights: Weights,
           prepare: list[PrepareFailure]) -> StepResult[KimiK3DeploymentStatus]:
    """The status, and the Events of what it says changed: Kueue states, a new generation applied,
    a rollout step, a placement limit."""
    status = compute_status(snap, admitted, observed)
    status = with_weights(status, weights, snap.obj["metadata"].get("generation"), bool(snap.sets))
    status.groups = with_prepare_failures(status.groups or [], prepare)
    out = StepResult(status, events=kueue_changes(stored_groups(snap.obj), status.groups or []))
    generation = snap.obj["metadata"].get("generation")
    if (snap.obj.get("status") or {}).get("observedGeneration") != generation and not observed.apply_error:
        kinds = ", ".join(c["kind"] for c in observed.rendered)
        out.events.append(Event("Normal", EventReason.APPLIED, f"generation {generation}: applied {kinds}; {observed.desired} "
                                f"group(s) of {admitted.plan.nodes_per_group} pods x {admitted.plan.gpus_per_node} GPUs"))
    step = step_event(status, admitted, observed.desired)
    if step is not None:
        out.events.append(Event("Normal", *step))
    limited = status.condition(ConditionType.SCALING_LIMITED)
    if limited and limited.status == "True" and limited.reason != Reason.ALL_GROUPS_PLACED:
        out.events.append(Event("Warning", event_reason(limited.reason), limited.message))
    ready = status.condition(ConditionType.READY)
    out.requeue_after = RESYNC_READY_S if ready is not None and ready.status == "True" else RESYNC_STARTING_S
    return out
