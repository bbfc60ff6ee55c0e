"""A PodDisruptionBudget that bounds the *groups* voluntary disruptions take down (failure case F3).

A group with any pod gone is down, and the Eviction API counts pods, never groups. The budget
is therefore stated as "at most ``D`` pods of the deployment unavailable", where ``D`` is the
number of groups that may be down (``replicas - groups that must stay``): every down group has at
least one pod that is not Ready (or missing), so while ``D`` pods are unavailable the API server
refuses the next eviction (HTTP 429), and an eviction it grants takes down at most one more group.
A pod-count budget of ``groups x size`` (what this file rendered before) let ``D x size`` pods of
``D x size`` *different* groups go at once.

It is written as an absolute ``minAvailable = pods - D`` rather than ``maxUnavailable: D``:
Kubernetes' disruption controller counts a missing pod against ``maxUnavailable`` only while a
sibling of its StatefulSet exists, and a LeaderWorkerSet group being recreated has a leader
(Ready at once on a simulated tray) before its worker StatefulSet has any pod. With an absolute
``minAvailable`` every pod the fleet wants and does not have Ready counts. ``pods`` is the fleet's
(``fleet_pods``: every LeaderWorkerSet a rollout runs, or the live pods when more, as in a
scale-down whose pods still run), so a budget is never looser than ``D`` groups.

When the budget would block every voluntary disruption (the groups that must stay up >= replicas,
e.g. replicas <= 1) no budget is made and the caller reports a Warning: a budget nobody can
satisfy stalls node drains forever. ``unhealthyPodEvictionPolicy: AlwaysAllow``: a pod that is not
Ready belongs to a group that is already down, and evicting it takes nothing more down.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube import pods as kpods
from kimik3.kube.kinds import POD_DISRUPTION_BUDGET
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_NAME_LABEL
from kimik3.render.meta import Owner
from kimik3.topology.plan import GroupPlan


def groups_that_must_stay(min_available: int | str, replicas: int) -> int:
    """Groups kept up: a count, or a percentage of ``replicas`` rounded up (as Kubernetes rounds minAvailable)."""
    if isinstance(min_available, str):
        return math.ceil(replicas * int(min_available.rstrip("%")) / 100)
    return min_available


def groups_that_may_go(spec: KimiK3DeploymentSpec, replicas: int) -> int:
    """Groups voluntary disruptions may take down at once: ``replicas`` minus those that must stay (>= 0)."""
    return max(0, replicas - groups_that_must_stay(spec.disruption_budget.min_available, replicas))


def disruption_budget(owner: Owner, spec: KimiK3DeploymentSpec, plan: GroupPlan,
                      replicas: int) -> tuple[dict[str, Any] | None, str | None]:
    """The budget for ``replicas`` groups at rest, or (None, why) when none should exist."""
    if not spec.disruption_budget.enabled:
        return None, None
    may_go = groups_that_may_go(spec, replicas)
    if replicas <= 1 or may_go == 0:
        return None, (f"no PodDisruptionBudget: with {replicas} group(s) and minAvailable "
                      f"{spec.disruption_budget.min_available} no group could ever be drained")
    return {
        "apiVersion": POD_DISRUPTION_BUDGET.api_version,
        "kind": POD_DISRUPTION_BUDGET.kind,
        "metadata": owner.metadata(owner.name),
        "spec": {
            "minAvailable": replicas * plan.nodes_per_group - may_go,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: owner.name},  # the pods of all its LeaderWorkerSets
                         "matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }, None


def fleet_pods(engine_sets: Iterable[dict[str, Any]], live: Iterable[dict[str, Any]]) -> int:
    """Pods the budget counts: ``replicas x size`` summed over the LeaderWorkerSets applied
    (``engine_sets``), or the pods of ``live`` not being deleted when there are more."""
    wanted = sum(int(s["spec"]["replicas"]) * int(s["spec"]["leaderWorkerTemplate"]["size"]) for s in engine_sets)
    return max(wanted, sum(1 for p in live if not kpods.is_terminating(p)))


def over_fleet(budget: dict[str, Any], spec: KimiK3DeploymentSpec, replicas: int, pods: int) -> dict[str, Any]:
    """``budget`` (from ``disruption_budget`` for ``replicas`` groups) counting ``pods`` pods
    (``fleet_pods``): ``minAvailable = pods - groups_that_may_go``."""
    return {**budget, "spec": {**budget["spec"], "minAvailable": pods - groups_that_may_go(spec, replicas)}}
