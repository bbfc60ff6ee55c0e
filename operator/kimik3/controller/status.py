"""The CR's status from what exists: the LeaderWorkerSets, their pods, spec problems, the
autoscaler's step, and where a rollout stands (``controller.rollout``).

Pure functions (no API calls) that build the typed ``KimiK3DeploymentStatus``; the reconciler
writes ``status_patch(status)`` through the status subresource. Conditions follow the Kubernetes
API conventions: a map-list keyed by type, ``lastTransitionTime`` changed only when ``status``
changes, ``observedGeneration`` on each. Their types and reasons are ``kimik3.api.conditions``;
a ScalingLimited condition with another writer's reason is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from kimik3.admission import Admitted
from kimik3.api.conditions import QUEUE_NOT_SERVED, ConditionStatus, ConditionType, Reason, Verdict
from kimik3.api.v1alpha1 import (Condition, DecodeStatus, IdleStatus, KimiK3DeploymentStatus, PlanStatus,
                                 RolloutStatus, RoutingStatus, ScaleEvent)
from kimik3.controller.fleet import EngineSet
from kimik3.controller.capacity import reserved_groups
from kimik3.controller.groups import group_statuses, split_message
from kimik3.controller.snapshot import Snapshot
from kimik3.controller.rollout import RolloutStep, rollout_status, surge_blocked
from kimik3.controller.rollout import progressing as rollout_progressing
from kimik3.controller.waits import KUEUE_GATE_PREFIX, waiting_for
from kimik3.kube import pods as kpods
from kimik3.kube.groups import Group
from kimik3.kube.labels import DEPLOYMENT_LABEL, KUEUE_SUSPENDING_PARENT_ANNOTATION, LWS_NAME_LABEL
from kimik3.kube.pods import (domain_affinity_keys, group_index, is_unschedulable, scheduling_gates,
                              unschedulable_message)
from kimik3.kube.times import rfc3339
from kimik3.kube.workloads import waiting
from kimik3.render.meta import Owner, selector_string
from kimik3.render.service import endpoint, leader_selector
from kimik3.topology.capacity import Domain

MESSAGE_LIMIT = 4096
"""Characters of a condition message kept (the rest is cut)."""


@dataclass(frozen=True)
class AutoscalerReport:
    """What one step of the autoscaler puts in the status (``controller.autoscaling``)."""

    desired_replicas: int
    """status.desiredReplicas: the groups it wants."""
    decode: DecodeStatus | None = None
    """status.decode of a decision that measured traffic; None: status.decode stays as it is."""
    last_scale: ScaleEvent | None = None
    """status.lastScale of a decision that changed replicas; None: it stays as it is."""
    metrics: Verdict | None = None
    """Condition MetricsAvailable now; None between decisions (the condition stays as it is)."""


def status_patch(status: KimiK3DeploymentStatus) -> dict[str, Any]:
    """``status`` as the CRD's JSON (camelCase aliases), the body of a JSON merge patch (RFC 7386)
    of the status subresource: unset top-level fields are left out, so the CR keeps what it holds
    there (e.g. status.decode between autoscaling decisions); an object the status sets (plan,
    decode, lastScale) is written whole, its unset fields as null, so nothing an earlier write
    left in it stays."""
    patch = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    for name, info in type(status).model_fields.items():
        value = getattr(status, name)
        if isinstance(value, BaseModel):
            patch[info.alias or name] = value.model_dump(by_alias=True, mode="json")
    return patch


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386: objects merge key by
    key, null removes a key, anything else replaces)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def stored_conditions(obj: dict[str, Any]) -> list[Condition]:
    """The conditions of ``obj.status`` (as the API server validated them against the CRD)."""
    return [Condition.model_validate(c) for c in (obj.get("status") or {}).get("conditions") or []]


def set_condition(conditions: list[Condition], type_: ConditionType, verdict: Verdict,
                  generation: int | None) -> list[Condition]:
    """``conditions`` with ``type_`` set to ``verdict``, sorted by type; the transition time
    moves only on a status change."""
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == verdict.status else rfc3339()
    entry = Condition(type=type_, status=verdict.status, reason=verdict.reason,
                      message=verdict.message[:MESSAGE_LIMIT], last_transition_time=since,
                      observed_generation=generation)
    return sorted([c for c in conditions if c.type != type_] + [entry], key=lambda c: c.type)


def _group_order(group: str) -> int:
    return int(group) if group.isdigit() else 1 << 30


def unschedulable_groups(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Groups the scheduler cannot place: ``{group index: (pod name, scheduler message)}``.

    A group counts when any of its pods is unschedulable (``kube.pods.is_unschedulable``: set by
    kube-scheduler when no node fits, e.g. no NVL72 rack has room for the group). The first such
    pod by name is quoted.
    """
    out: dict[str, tuple[str, str]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if is_unschedulable(pod):
            out.setdefault(group_index(pod) or "?", (pod["metadata"]["name"], unschedulable_message(pod)))
    return dict(sorted(out.items(), key=lambda kv: _group_order(kv[0])))


@dataclass(frozen=True)
class LeaderWithoutRoom:
    """A group whose leader is bound to a tray while a worker of it cannot follow into its rack
    (``leader_without_room``)."""

    leader: str
    """The leader pod's name."""
    old_pods: tuple[str, ...]
    """``"<pod> on <tray>"`` for each pod of the group still terminating on a tray. LeaderWorkerSet's
    exclusive affinity ties a group's pods to the rack of the pods with its key, and a recreated
    group keeps its key (a hash of the leader's namespace and name), so these pin it to their rack."""


def leader_without_room(groups: Iterable[Group]) -> LeaderWithoutRoom | None:
    """The first group whose leader is bound to a tray while a worker of it is Unschedulable (under
    LeaderWorkerSet's exclusive topology the workers may only follow their leader into its rack:
    the rack the leader took has no room for them); None when no group is so."""
    for group in sorted(groups, key=lambda g: g.key):
        leader = group.live[0] if group.live and kpods.is_leader(group.live[0]) else None
        if leader is not None and kpods.node_name(leader) and any(map(is_unschedulable, group.live[1:])):
            old = tuple(f"{p['metadata']['name']} on {kpods.node_name(p)}" for p in group.pods
                        if kpods.is_terminating(p) and kpods.node_name(p))
            return LeaderWithoutRoom(str(leader["metadata"]["name"]), old)
    return None


def scaling_limited_message(unplaced: dict[str, tuple[str, str]], kueue_admitted: bool = False,
                            leader_first: LeaderWithoutRoom | None = None) -> str:
    """``ScalingLimited`` message for ``unschedulable_groups(...)`` (non-empty): the groups named
    once, the scheduler's message of the first quoted once (status.groups has each group's).
    ``kueue_admitted``: Kueue admitted these groups into a rack, yet the scheduler cannot bind
    them there (a deployment with placement exclusive repels every group from its rack).
    ``leader_first``: placement exclusive, the leader pod of a group whose workers cannot follow
    it into its rack (``leader_without_room``): why (no gang scheduling), what repairs it once,
    and placement kueue as the fix."""
    groups = ", ".join(unplaced)
    first, (pod, msg) = next(iter(unplaced.items()))
    noun = "group" if len(unplaced) == 1 else "groups"
    why = ("cannot be bound in the rack Kueue admitted them into" if kueue_admitted
           else "cannot be placed now (no rack or node has room)")
    text = f"{noun} {groups} {why}; group {first}: pod {pod} is Unschedulable: {msg or '(no scheduler message)'}"
    text += "; status.groups has each group's message" if len(unplaced) > 1 else ""
    if kueue_admitted:
        text += ("; Kueue does not see pod anti-affinity: a deployment with placement exclusive repels every "
                 "other group from its rack, so use placement kueue for every deployment on these racks")
    elif leader_first is not None and leader_first.old_pods:
        text += ("; placement exclusive has no gang scheduling, and LeaderWorkerSet's exclusive affinity ties a "
                 "recreated group to the rack of its old pods (the group keeps its key): "
                 f"{', '.join(leader_first.old_pods)} still terminating (a tray that does not answer keeps its pods "
                 "until it is back, or until its node is tainted node.kubernetes.io/out-of-service or deleted), so "
                 f"the leader {leader_first.leader} was bound in that rack and its workers find no free tray there, "
                 "even while another rack has room for the group: it waits for the tray. Placement kueue admits each "
                 "group whole into a rack with room")
    elif leader_first is not None:
        text += (f"; placement exclusive has no gang scheduling: the leader {leader_first.leader} was bound first "
                 "and its workers may only join it in its rack, which has no free tray for them, so the group waits "
                 "there even while another rack has room for it. Deleting pod "
                 f"{leader_first.leader} recreates the whole group (its new leader may land in a rack with room); "
                 "placement kueue admits each group whole into a rack with room")
    return text


PLACEMENT_REASONS = (Reason.GROUP_SPLIT_ACROSS_RACKS, Reason.UNSCHEDULABLE, Reason.QUOTA_EXHAUSTED,
                     Reason.NO_RACK_FITS, Reason.PREEMPTED, Reason.KUEUE_PENDING, *QUEUE_NOT_SERVED,
                     Reason.ALL_GROUPS_PLACED, Reason.GROUPS_NOT_CREATED, Reason.GROUPS_NOT_PLACED)
"""ScalingLimited reasons this module writes (another writer's reason is left alone)."""
KUEUE_REASONS: dict[str, Reason] = {"quota": Reason.QUOTA_EXHAUSTED, "topology": Reason.NO_RACK_FITS,
                                    "preempted": Reason.PREEMPTED, "pending": Reason.KUEUE_PENDING}
"""``kube.workloads.Wait`` -> the ScalingLimited reason that says it, in order of precedence."""


def kueue_limit(workloads: list[dict[str, Any]], queue: str | None, free_block: Domain | None = None,
                trays_per_group: int = 1) -> Verdict | None:
    """``ScalingLimited=True`` when Kueue has not admitted some group: the reason of the first
    kind in ``KUEUE_REASONS`` order among the waiting groups, the groups named once, Kueue's
    message of that kind's first group quoted once, the groups waiting for another reason named
    by kind; for ``NoRackFits`` the largest free block of trays (``free_block``, from the nodes;
    None when the operator cannot read them) beside the ``trays_per_group`` a group needs. Each
    group's own message is in status.groups. None when every Workload is admitted."""
    waits = sorted((w for w in map(waiting, workloads) if w is not None), key=lambda w: _group_order(w.group))
    if not waits:
        return None
    first = min(waits, key=lambda w: list(KUEUE_REASONS).index(w.why))
    groups = ", ".join(w.group for w in waits)
    noun = "group" if len(waits) == 1 else "groups"
    message = f"{noun} {groups} not admitted by Kueue (LocalQueue {queue}); group {first.group}: {first.message}"
    if first.why == "topology" and free_block is not None:
        message += (f"; the largest free block is {len(free_block.free)} of {free_block.trays} trays "
                    f"(rack {free_block.name}) and a group needs {trays_per_group}")
    others: dict[str, list[str]] = {}
    for w in waits:
        if w.why != first.why:
            others.setdefault(w.why, []).append(w.group)
    for why, names in others.items():
        message += f"; {KUEUE_REASONS[why]}: group{'s' if len(names) > 1 else ''} {', '.join(names)}"
    if len(waits) > 1:
        message += "; status.groups has each group's state and Kueue's message"
    return Verdict("True", KUEUE_REASONS[first.why], message)


def split_groups(groups: Iterable[Group]) -> list[Group]:
    """The groups whose pods are in more than one NVLink domain (``kube.groups.Group.split``)."""
    return [g for g in groups if g.split]


def split_verdict(split: list[Group], admitted: Admitted) -> Verdict:
    """``ScalingLimited=True GroupSplitAcrossRacks`` for the ``split`` groups (non-empty): each
    group and its racks, and what to do about the first. Placement kueue, its pods carrying
    Kueue's mark (``KUEUE_SUSPENDING_PARENT_ANNOTATION``: Kueue manages them): the operator
    deletes its Workload once admitted, for Kueue to admit it again whole (``controller.readmit``);
    unmarked: Kueue's webhooks never saw the group. Placement exclusive: the LeaderWorkerSet's pod
    webhook gives each pod an affinity to its group's NVLink domain (the exclusive-topology
    annotation); a leader pod without one on the topology key means the webhook did not run, else
    a tray's label changed after binding. Deleting the leader pod makes the LeaderWorkerSet
    recreate the whole group (RecreateGroupOnPodRestart)."""
    key = admitted.spec.scheduling.topology_key
    text = "; ".join(map(split_message, split)) + f" (racks: the trays' {key} label); not counted Ready"
    leader = split[0].live[0]
    name = leader["metadata"]["name"]
    if admitted.spec.scheduling.placement.mode == "kueue":
        if KUEUE_SUSPENDING_PARENT_ANNOTATION in (leader["metadata"].get("annotations") or {}):
            return Verdict("True", Reason.GROUP_SPLIT_ACROSS_RACKS, text + (
                "; the operator deletes each such group's Kueue Workload so that Kueue admits the group again "
                "whole, into one rack with room (Event GroupSplitAcrossRacks)"))
        return Verdict("True", Reason.GROUP_SPLIT_ACROSS_RACKS, text + (
            f"; pod {name} lacks Kueue's {KUEUE_SUSPENDING_PARENT_ANNOTATION} mark, so Kueue never admitted the "
            "group and its pods were scheduled without it: register Kueue's webhooks (mleaderworkerset.kb.io and "
            f"mpod.kb.io) with the LeaderWorkerSet integration on, then delete pod {name}: the LeaderWorkerSet "
            "recreates the whole group and Kueue admits it whole"))
    leader = split[0].live[0]
    if key not in domain_affinity_keys(leader):
        return Verdict("True", Reason.GROUP_SPLIT_ACROSS_RACKS, text + (
            f"; pod {name} has no pod affinity on {key}: LeaderWorkerSet's pod webhook did not add the exclusive "
            "topology, so nothing keeps a group in one rack. Register the LeaderWorkerSet webhooks (pods "
            f"included), then delete pod {name}: the LeaderWorkerSet recreates the whole group; or use placement "
            "kueue"))
    return Verdict("True", Reason.GROUP_SPLIT_ACROSS_RACKS, text + (
        f"; its pods do carry the exclusive affinity on {key}, so a tray's label changed after its pod was "
        f"bound: delete pod {name}, and the LeaderWorkerSet recreates the whole group inside one rack"))


def _ready(ready: int, desired_groups: int, pods: list[dict[str, Any]], admitted: Admitted,
           queue: Verdict | None = None, split: list[Group] | None = None,
           stopped: Verdict | None = None) -> Verdict:
    """Ready from ``ready`` groups (the LeaderWorkerSets' count less the ``split`` ones); ``stopped``
    (Stopped=True, ``controller.idle``) is what it says at 0 groups."""
    if desired_groups == 0 and stopped is not None and stopped.status == "True":
        return stopped
    if desired_groups == 0:
        return Verdict("True", Reason.SCALED_TO_ZERO, "replicas is 0: no groups run and no GPUs are held")
    if ready >= desired_groups:
        return Verdict("True", Reason.ALL_GROUPS_READY, f"{ready}/{desired_groups} groups ready")
    if queue is not None:
        return Verdict("False", queue.reason, f"{ready}/{desired_groups} groups ready; {queue.message}")
    if split:
        return Verdict("False", Reason.GROUPS_NOT_READY, f"{ready}/{desired_groups} groups ready; "
                       + "; ".join(map(split_message, split)) + " (ScalingLimited says what to do)")
    detail = waiting_for(pods, admitted, desired_groups)
    if not detail:
        detail = ("every pod is Ready; waiting for the LeaderWorkerSet to count the groups ready" if pods
                  else "waiting for the LeaderWorkerSet to create the groups")
    return Verdict("False", Reason.GROUPS_NOT_READY, f"{ready}/{desired_groups} groups ready; {detail}")


@dataclass(frozen=True)
class Observed:
    """What this reconcile's steps decided and found, beside the snapshot (``controller.steps``)."""

    desired: int
    """The fleet's replicas (groups) rendered."""
    target: EngineSet | None
    """The LeaderWorkerSet running the spec's templates."""
    rendered: list[dict[str, Any]] = field(default_factory=list)
    """The children applied (or held back) this reconcile."""
    apply_error: str | None = None
    """Why some child was not applied (the API server's words), None when all were."""
    compute_domain_note: str | None = None
    """Why the plan's ComputeDomain is not made (``render.children.COMPUTE_DOMAIN_SKIPPED``)."""
    autoscaled: AutoscalerReport | None = None
    """What the autoscaler's step reports (None with autoscaling off: its fields stay as the CR holds them)."""
    crash_looping: Verdict | None = None
    """Degraded of groups that keep failing (``controller.recreation``)."""
    compute_domain: Verdict | None = None
    """ComputeDomainReady (``controller.computedomains``; never changes Ready)."""
    rollout_step: RolloutStep | None = None
    """What ``controller.rollout.Rollouts`` decided (canary, rollback, pause)."""
    queue: Verdict | None = None
    """Placement kueue: why no group is created (``controller.queues``), None when nothing is held for it."""
    routing: RoutingStatus | None = None
    """``status.routing`` (``controller.routing``), None with routing off."""
    routing_ready: Verdict | None = None
    """RoutingReady, None with routing off (the condition is then removed)."""
    gateway: Verdict | None = None
    """GatewayReady, None without an HTTPRoute (the condition is then removed)."""
    stopped: Verdict | None = None
    """Stopped (``controller.idle``; None without spec.idle.stopAfter): while True, Ready says it too."""
    idle: IdleStatus | None = None
    """status.idle (None: it stays as the CR holds it)."""
    placement_conflict: Verdict | None = None
    """PlacementConflict (``controller.placementmix``), None: the condition stays as it is."""


def _progressing(snap: Snapshot, admitted: Admitted, observed: Observed, ready: Verdict,
                 rollout: RolloutStatus | None) -> Verdict:
    """Progressing: an apply failure, else where a rollout stands (``controller.rollout``), else
    Stable once every desired group is Ready, else the groups starting."""
    running = [s for s in snap.sets if not s.deleting]
    rolling = rollout_progressing(admitted, snap.sets, rollout, observed.desired,
                                  surge_blocked(snap.pods, snap.workloads, observed.target) if len(running) > 1
                                  else None)
    step = observed.rollout_step
    if rollout is not None and step is not None:
        rollout.canary, rollout.rolled_back, rollout.progress = step.canary, step.rolled_back, step.progress
        if step.verdict is not None and not (rolling is not None and rolling.reason == Reason.SURGE_BLOCKED):
            rolling = step.verdict  # a canary group without room says SurgeBlocked
    if observed.apply_error:
        return Verdict("True", Reason.APPLY_FAILED,
                       f"children not applied yet (retrying with back-off): {observed.apply_error}")
    if rolling is not None:
        return rolling
    groups = sum(int(((s.lws.get("status") or {}).get("replicas")) or 0) for s in running)
    if ready.status == "True" and groups == observed.desired:
        return Verdict("False", Reason.STABLE, "children applied; all groups as desired")
    return Verdict("True", Reason.GROUPS_STARTING, ready.message)


def _scaling_limited(snap: Snapshot, admitted: Admitted, observed: Observed,
                     previous: Condition | None) -> Verdict | None:
    """ScalingLimited: the queue Kueue does not serve (no group created), else from Kueue's
    Workloads, else from pods the scheduler cannot place; when neither, False ``AllGroupsPlaced``
    once every group the deployment wants exists, else Unknown ``GroupsNotCreated`` (unless
    another writer's reason holds it); None: left as it is."""
    if observed.queue is not None:
        return observed.queue
    split = split_groups(snap.groups.values())
    if split:
        return split_verdict(split, admitted)
    kueue_wait = kueue_limit(snap.workloads or [], admitted.spec.scheduling.placement.queue_name, snap.free_block,
                             admitted.plan.nodes_per_group)
    if kueue_wait is not None:
        return kueue_wait
    unplaced = unschedulable_groups(snap.pods)
    if unplaced:
        exclusive = admitted.spec.scheduling.placement.mode == "exclusive" and admitted.plan.clique_placement
        return Verdict("True", Reason.UNSCHEDULABLE, scaling_limited_message(
            unplaced, bool(snap.workloads), leader_without_room(snap.groups.values()) if exclusive else None))
    if previous is not None and previous.reason not in PLACEMENT_REASONS:
        return None
    live = {s.name: s.replicas for s in snap.sets if not s.deleting}
    groups = [g for g in snap.groups.values() if g.live and g.index < live.get(g.leader_worker_set, 0)]
    if len(groups) < observed.desired:
        return Verdict("Unknown", Reason.GROUPS_NOT_CREATED, (
            f"{len(groups)} of {observed.desired} groups exist; the others are not created yet "
            f"({'no LeaderWorkerSet exists' if not live else 'waiting for the LeaderWorkerSet controller'})"))
    unplaced_pods = not_placed(groups, admitted.plan.nodes_per_group, snap.workloads)
    if unplaced_pods:
        return Verdict("Unknown", Reason.GROUPS_NOT_PLACED, unplaced_pods)
    return Verdict("False", Reason.ALL_GROUPS_PLACED, (
        f"every pod of the {len(groups)} group(s) is bound to a tray"
        + (", each group inside one rack" if admitted.plan.clique_placement else "")))


def not_placed(groups: list[Group], nodes_per_group: int, workloads: list[dict[str, Any]] | None) -> str:
    """Why some of ``groups`` (each of ``nodes_per_group`` pods) is not placed although no
    scheduler or Kueue message says so: its first pod bound to no tray and its scheduling gates
    (Kueue's, with no Workload read for the group: is the Kueue manager running?), or a group
    short of pods; "" when every pod of every group is bound."""
    for group in groups:
        unbound = [p for p in group.live if not kpods.node_name(p)]
        if unbound:
            pod, gates = unbound[0], scheduling_gates(unbound[0])
            text = (f"group {group.index}: pod {pod['metadata']['name']} is bound to no tray"
                    + (f" (scheduling gates: {', '.join(gates)})" if gates else " (not scheduled yet)"))
            if any(g.startswith(KUEUE_GATE_PREFIX) for g in gates) and not workloads:
                text += ("; Kueue made no Workload for the deployment's groups: is the Kueue manager running "
                         "with its LeaderWorkerSet integration on?")
            return text
        if len(group.live) < nodes_per_group:
            return (f"group {group.index}: {len(group.live)} of {nodes_per_group} pods exist; the LeaderWorkerSet "
                    "is (re)creating them")
    return ""


def compute_status(snap: Snapshot, admitted: Admitted, observed: Observed) -> KimiK3DeploymentStatus:
    """Status of a reconciled CR whose spec this reconcile admitted (``admitted``), from the
    snapshot taken after the applies (``controller.snapshot``: the LeaderWorkerSets, their pods
    and groups, the Workloads under placement ``kueue``, the racks of the trays, the largest free
    block of trays while a group waits for a rack) and what the steps found (``observed``)."""
    obj, plan, autoscaled = snap.obj, admitted.plan, observed.autoscaled
    gen = obj["metadata"].get("generation")
    running = [s for s in snap.sets if not s.deleting]
    split = split_groups(snap.groups.values())
    replicas = {s.name: s.replicas for s in running}
    counted = sum(1 for g in split if g.ready and g.index < replicas.get(g.leader_worker_set, 0))
    ready = max(0, sum(int(((s.lws.get("status") or {}).get("readyReplicas")) or 0) for s in running) - counted)
    ready_v = _ready(ready, observed.desired, snap.pods, admitted, observed.queue, split, observed.stopped)
    rollout = rollout_status(snap.sets, observed.target, snap.groups) if running else None
    conditions = set_condition(stored_conditions(obj), ConditionType.READY, ready_v, gen)
    conditions = set_condition(conditions, ConditionType.PROGRESSING,
                               _progressing(snap, admitted, observed, ready_v, rollout), gen)
    limited = _scaling_limited(snap, admitted, observed, next((c for c in conditions
                                                     if c.type == ConditionType.SCALING_LIMITED), None))
    degraded = (Verdict("True", Reason.APPLY_FAILED, observed.apply_error) if observed.apply_error
                else observed.crash_looping or Verdict("False", Reason.AS_EXPECTED, "children applied"))
    for type_, verdict in ((ConditionType.SCALING_LIMITED, limited), (ConditionType.DEGRADED, degraded),
                           (ConditionType.METRICS_AVAILABLE, autoscaled.metrics if autoscaled else None),
                           (ConditionType.COMPUTE_DOMAIN_READY, observed.compute_domain),
                           (ConditionType.PLACEMENT_CONFLICT, observed.placement_conflict),
                           (ConditionType.STOPPED, observed.stopped)):
        if verdict is not None:
            conditions = set_condition(conditions, type_, verdict, gen)
    for type_, verdict in ((ConditionType.ROUTING_READY, observed.routing_ready),
                           (ConditionType.GATEWAY_READY, observed.gateway)):
        conditions = (set_condition(conditions, type_, verdict, gen) if verdict is not None
                      else [c for c in conditions if c.type != type_])
    note, owner = observed.compute_domain_note, snap.owner
    return KimiK3DeploymentStatus(
        observed_generation=gen,
        conditions=conditions,
        replicas=sum(int(((s.lws.get("status") or {}).get("replicas")) or 0) for s in running),
        ready_replicas=ready,
        desired_replicas=autoscaled.desired_replicas if autoscaled else None,
        selector=selector_string(leader_selector(owner)),
        endpoint=endpoint(owner, admitted.spec),
        plan=PlanStatus(gpus_per_node=plan.gpus_per_node, nodes_per_group=plan.nodes_per_group,
                        gpus_per_group=plan.gpus_per_group, compute_domain=plan.needs_compute_domain and not note,
                        compute_domain_note=note if plan.needs_compute_domain else None),
        decode=autoscaled.decode if autoscaled else None,
        last_scale=autoscaled.last_scale if autoscaled else None,
        idle=observed.idle,
        groups=group_statuses(snap.groups, snap.workloads, snap.sets, observed.target, observed.desired,
                              reserved_groups(admitted.spec)),
        rollout=rollout,
        routing=observed.routing,
        engine_overrides=list(admitted.overrides),
    )


def invalid_status(obj: dict[str, Any], problems: str) -> KimiK3DeploymentStatus:
    """Status of a CR whose spec the operator refuses: nothing was changed, every problem named."""
    gen = obj["metadata"].get("generation")
    conditions = stored_conditions(obj)
    refused: tuple[tuple[ConditionType, ConditionStatus], ...] = (
        (ConditionType.READY, "False"), (ConditionType.PROGRESSING, "False"), (ConditionType.DEGRADED, "True"))
    for type_, status in refused:
        conditions = set_condition(conditions, type_, Verdict(status, Reason.INVALID_SPEC, problems), gen)
    return KimiK3DeploymentStatus(observed_generation=gen, conditions=conditions)


def lws_selector(owner: Owner) -> str:
    """Selector of every pod of the deployment's LeaderWorkerSets."""
    return f"{DEPLOYMENT_LABEL}={owner.name},{LWS_NAME_LABEL}"
