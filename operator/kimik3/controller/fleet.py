"""The deployment's LeaderWorkerSets: one per revision of the group templates (blue/green).

LeaderWorkerSet v0.9.0 keeps every group of a LeaderWorkerSet in one leader StatefulSet, so in
its own rollout a surge group can never take an old group's place: a one-group Surge rollout
loads twice (docs/rollouts.md). The operator therefore never changes the templates of a live
LeaderWorkerSet. A template change creates a new one, the *target*, beside the *old* ones, and
each reconcile moves groups from the old to the target as the target's groups turn Ready
(``sizes``): with ``R`` replicas, ``S`` maxSurge and ``U`` maxUnavailable (Recreate: ``U = R``,
``S = 0``), in groups::

    old    = max(0, min(old groups now, R - ready target groups - U))   (never grows)
    target = min(R, R + S - old)

So at most ``R + S`` groups exist, at least ``R - U`` stay Ready (once they were), every group
loads once, and an old LeaderWorkerSet left with no group is deleted. With Surge the last
serving group is never taken down: while a surge group can stand in (``S >= 1``) ``U`` counts at
most ``R - 1``. Several old ones (an edit during a rollout, F17) keep their Ready groups first. A canary holds the target at ``canary.groups`` beside every old group; a pause creates no
target and freezes every set's groups; a rolled-back template is not created again, the newest
old set serving as the target with its own templates while the rolled-back sets drain (their
Ready groups serve until the restored groups are Ready).

Names: the first LeaderWorkerSet is ``<name>-engine``; a new target takes ``<name>-engine`` when
no LeaderWorkerSet of that name exists, else ``<name>-engine-<template hash, 8 hex digits>``.
Every set carries the deployment's replicas it was sized for (``REPLICAS_ANNOTATION``), read back
as the fleet's replicas (the autoscaler's "current").

Pure functions: no API calls.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kimik3.kube.groups import Group, GroupKey
from kimik3.kube.kinds import GROUP
from kimik3.kube.objects import is_deleting
from kimik3.render.revision import TEMPLATE_HASH_ANNOTATION

REPLICAS_ANNOTATION = f"{GROUP}/replicas"
"""On each LeaderWorkerSet (not in its templates): the deployment's replicas when it was sized."""
NAME_HASH_DIGITS = 8


@dataclass(frozen=True)
class EngineSet:
    """One LeaderWorkerSet of the deployment, as read."""

    lws: dict[str, Any]
    name: str
    template_hash: str | None
    """``render.revision.TEMPLATE_HASH_ANNOTATION``: the templates it runs."""
    replicas: int
    """Its ``spec.replicas``."""
    ready: int
    """Its groups (index below ``replicas``) that serve: Ready and inside one NVLink domain
    (``kube.groups.Group.serving``)."""
    deleting: bool


def engine_sets(lwss: list[dict[str, Any]], groups: Mapping[GroupKey, Group]) -> list[EngineSet]:
    """The deployment's LeaderWorkerSets ``lwss`` with their ``groups`` (``kube.groups.groups_of``
    of their pods), oldest first (creationTimestamp, then name)."""
    out = []
    for lws in lwss:
        meta = lws["metadata"]
        replicas = int((lws.get("spec") or {}).get("replicas") or 0)
        ready = sum(1 for (name, index), group in groups.items() if name == meta["name"] and index < replicas
                    and group.serving)
        out.append(EngineSet(lws, meta["name"], (meta.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION),
                             replicas, ready, is_deleting(lws)))
    return sorted(out, key=lambda s: (s.lws["metadata"].get("creationTimestamp") or "~", s.name))


def fleet_replicas(sets: list[EngineSet]) -> int | None:
    """The deployment's replicas the newest live set was sized for (its ``REPLICAS_ANNOTATION``,
    else its ``spec.replicas``); None when there is no live set."""
    live = [s for s in sets if not s.deleting]
    if not live:
        return None
    newest = live[-1]
    value = (newest.lws["metadata"].get("annotations") or {}).get(REPLICAS_ANNOTATION)
    return int(value) if value is not None and str(value).isdigit() else newest.replicas


def sizes(replicas: int, surge: int, unavailable: int, target_ready: int, old: list[tuple[int, int]],
          canary: int | None = None, target_now: int = 0, make_room: bool = False) -> tuple[int, list[int]]:
    """Groups of the target and of each old set (``old``: (groups, Ready groups) of each now,
    oldest first) for ``replicas`` groups in all (see the module); ``canary``: the target held at
    that many groups beside every old group (old sets keep theirs, at most ``replicas`` in all),
    never below the ``target_now`` groups it has (a canary set on mid-rollout shrinks nothing).
    The old groups kept are their Ready ones first (oldest set first), then the others (newest
    first): an edit during a rollout (F17) gives up a group still loading before a serving one.
    ``make_room``: a target group has no room (SurgeBlocked): only the Ready old groups are kept,
    so an old group that is not Ready gives its place to a target group (surge room is needed only
    to keep serving groups serving)."""
    if surge >= 1 and replicas >= 1:
        unavailable = min(unavailable, replicas - 1)
    total = sum(groups for groups, _ in old)
    budget = min(total, replicas) if canary is not None else max(0, min(total, replicas - target_ready - unavailable))
    kept = [0] * len(old)
    for i, (_, ready) in enumerate(old):
        kept[i] = min(ready, budget)
        budget -= kept[i]
    for i in [] if make_room else reversed(range(len(old))):
        more = min(old[i][0] - kept[i], budget)
        kept[i] += more
        budget -= more
    target = min(replicas, replicas + surge - sum(kept))
    return (min(target, max(canary, target_now)) if canary is not None else target), kept


@dataclass
class FleetPlan:
    """What one reconcile applies and deletes of the deployment's LeaderWorkerSets."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    """LeaderWorkerSet bodies, old sets first, the target last."""
    delete: list[str] = field(default_factory=list)
    """Old LeaderWorkerSets left with no group (a rolled-back template's among them once drained)."""
    target: str | None = None
    """The set the templates to serve run on; None while its name is still taken by a set being deleted."""
    complete: bool = False
    """Every old set is deleted now: the rollout to ``target`` is done (not a rollback's deletion)."""


def target_name(base: str, template_hash: str, sets: list[EngineSet]) -> str | None:
    """The name of a new target (see the module); None while that name is taken by a set still
    being deleted."""
    taken = {s.name for s in sets}
    if base not in taken:
        return base
    name = f"{base}-{template_hash[:NAME_HASH_DIGITS]}"
    return None if name in taken else name


def held(rendered: dict[str, Any], engine_set: EngineSet, replicas: int, fleet: int) -> dict[str, Any]:
    """``rendered`` with the name and templates of ``engine_set`` (which keeps running what it
    runs) at ``replicas`` groups; ``fleet``: the deployment's replicas (``REPLICAS_ANNOTATION``)."""
    body = sized(rendered, engine_set.name, replicas, fleet)
    live = engine_set.lws
    body["spec"]["leaderWorkerTemplate"] = copy.deepcopy(live["spec"]["leaderWorkerTemplate"])
    if engine_set.template_hash:
        body["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] = engine_set.template_hash
    return body


def sized(rendered: dict[str, Any], name: str, replicas: int, fleet: int) -> dict[str, Any]:
    """``rendered`` named ``name`` at ``replicas`` groups, sized for ``fleet`` replicas in all."""
    body = copy.deepcopy(rendered)
    body["metadata"]["name"] = name
    body["metadata"].setdefault("annotations", {})[REPLICAS_ANNOTATION] = str(fleet)
    body["spec"]["replicas"] = replicas
    return body


def plan(rendered: dict[str, Any], sets: list[EngineSet], replicas: int, surge: int, unavailable: int,
         canary: int | None = None, paused: bool = False, refused: str | None = None,
         make_room: bool = False) -> FleetPlan:
    """The LeaderWorkerSets to apply and delete for the ``rendered`` one (its name is the base
    name, its templates the spec's) at ``replicas`` groups, given the deployment's ``sets``;
    ``canary``: groups the target is held at; ``paused``: no new target, every set frozen;
    ``refused``: a template hash rolled back: never created again, its sets drained like old ones
    as the restored set's groups turn Ready (a canary's surge groups go at once: every old group
    still serves), the newest set of other templates being the target; ``make_room``: a target
    group has no room, old groups that are not Ready give theirs up (``sizes``)."""
    base = rendered["metadata"]["name"]
    want = (rendered.get("metadata") or {}).get("annotations", {}).get(TEMPLATE_HASH_ANNOTATION) or ""
    live = [s for s in sets if not s.deleting]
    out = FleetPlan()
    kept = [s for s in live if s.template_hash != refused] or live
    target = next((s for s in reversed(kept) if s.template_hash == want), None) if want != refused else None
    if target is None and (paused or want == refused) and kept:
        target = kept[-1]  # hold what runs: the newest set keeps its templates
    olds = [s for s in live if s is not target]
    if paused and olds:
        out.apply = [held(rendered, s, s.replicas, replicas) for s in live]
        out.target = target.name if target else None
        return out
    name = target.name if target is not None else target_name(base, want, sets)
    if name is None:  # the name is free once the set being deleted is gone
        out.apply = [held(rendered, s, s.replicas, replicas) for s in olds]
        return out
    grow, keep = sizes(replicas, surge, unavailable, target.ready if target else 0,
                       [(s.replicas, s.ready) for s in olds], canary, target.replicas if target else 0, make_room)
    for old, groups in zip(olds, keep):
        if groups:
            out.apply.append(held(rendered, old, groups, replicas))
        else:
            out.delete.append(old.name)
    out.complete = bool(olds) and len(out.delete) == len(olds) and refused is None
    if target is not None and target.template_hash != want:
        out.apply.append(held(rendered, target, grow, replicas))
    else:
        out.apply.append(sized(rendered, name, grow, replicas))
    out.target = name
    return out
