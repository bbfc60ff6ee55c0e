"""Revisions of the engine groups: the LeaderWorkerSet rollout a spec asks for.

LeaderWorkerSet v0.9.0 (``pkg/controllers/leaderworkerset_controller.go``) rolls its groups
whenever ``spec.leaderWorkerTemplate`` changes (its revision is a hash of that template and the
network config; ``rolloutStrategy`` is not part of it, so changing the strategy or the partition
restarts nothing). With ``maxSurge`` S and ``maxUnavailable`` U it creates S new groups above
``replicas`` (indices replicas..replicas+S-1, on the new template), and replaces old groups from
the highest index down, at most ``U + S - (surge groups not yet gone)`` at a time, each only once
the groups above it are Ready on the new revision; the surge groups are deleted once every group
below ``replicas`` runs the new revision Ready. ``partition`` P keeps groups below P on the old
revision: with P = replicas only the surge groups run the new revision (a canary beside every old
group). So a one-group Surge rollout loads twice (the surge group, then group 0
on the new template) and is never without a Ready group.
"""

from __future__ import annotations

from typing import Any

from kimik3.api.v1alpha1 import RolloutSpec

RECREATE_UNAVAILABLE = "100%"
"""maxUnavailable of strategy Recreate: LWS replaces every group at once."""


def rollout_strategy(rollout: RolloutSpec, partition: int = 0) -> dict[str, Any]:
    """The LeaderWorkerSet's ``spec.rolloutStrategy`` for ``rollout``; ``partition``: groups below
    this index stay on the old revision (the rollout controller holds it at replicas during a
    canary bake or a pause, 0 otherwise)."""
    config: dict[str, Any] = {"maxUnavailable": RECREATE_UNAVAILABLE if rollout.unavailable is None
                              else rollout.unavailable, "maxSurge": rollout.surge}
    if partition:
        config["partition"] = partition
    return {"type": "RollingUpdate", "rollingUpdateConfiguration": config}
