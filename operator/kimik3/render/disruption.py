"""A PodDisruptionBudget that counts whole groups (failure case F3).

A group with any pod gone is down, so the budget is stated in groups and converted to pods:
``minAvailable = groups that must stay up x pods per group``. With replicas=4, size 8 and 75%
that is 3 groups = 24 pods, so one group may go. When the budget would block every voluntary
disruption (the groups that must stay up >= replicas, e.g. replicas <= 1) no budget is made and
the caller reports a Warning: a budget nobody can satisfy stalls node drains forever.
"""

from __future__ import annotations

import math
from typing import Any

from kimik3.kube.kinds import POD_DISRUPTION_BUDGET
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_NAME_LABEL
from kimik3.render.meta import Owner
from kimik3.topology.plan import GroupPlan


def groups_that_must_stay(min_available: int | str, replicas: int) -> int:
    """Groups kept up: a count, or a percentage of ``replicas`` rounded up (as Kubernetes rounds minAvailable)."""
    if isinstance(min_available, str):
        return math.ceil(replicas * int(min_available.rstrip("%")) / 100)
    return min_available


def disruption_budget(owner: Owner, spec: KimiK3DeploymentSpec, plan: GroupPlan,
                      replicas: int) -> tuple[dict[str, Any] | None, str | None]:
    """The budget, or (None, why) when none should exist."""
    if not spec.disruption_budget.enabled:
        return None, None
    keep = groups_that_must_stay(spec.disruption_budget.min_available, replicas)
    if replicas <= 1 or keep >= replicas:
        return None, (f"no PodDisruptionBudget: with {replicas} group(s) and minAvailable "
                      f"{spec.disruption_budget.min_available} no group could ever be drained")
    return {
        "apiVersion": POD_DISRUPTION_BUDGET.api_version,
        "kind": POD_DISRUPTION_BUDGET.kind,
        "metadata": owner.metadata(owner.name),
        "spec": {
            "minAvailable": keep * plan.nodes_per_group,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: owner.name},  # the pods of all its LeaderWorkerSets
                         "matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }, None
