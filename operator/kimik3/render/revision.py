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

import hashlib
import json
from typing import Any

from kimik3.api.v1alpha1 import RolloutSpec
from kimik3.kube.kinds import GROUP

TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-hash"
"""On the LeaderWorkerSet (not in its templates, so it restarts nothing): ``template_hash`` of the
templates the operator rendered, so a template change is told from a replica change."""
RECREATE_UNAVAILABLE = "100%"
"""maxUnavailable of strategy Recreate: LWS replaces every group at once."""


def template_hash(template: dict[str, Any]) -> str:
    """A short hash of a rendered ``leaderWorkerTemplate`` (12 hex digits of SHA-256 of its JSON)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def rollout_strategy(rollout: RolloutSpec, replicas: int, partition: int = 0) -> dict[str, Any]:
    """The LeaderWorkerSet's ``spec.rolloutStrategy`` for ``rollout`` at ``replicas`` groups;
    ``partition``: groups below this index stay on the old revision (the rollout controller holds
    it at replicas during a canary bake or a pause, 0 otherwise). With Surge the last serving
    group is never taken down: while a surge group can stand in (maxSurge >= 1), maxUnavailable
    counts at most ``replicas - 1`` groups."""
    unavailable: int | str = RECREATE_UNAVAILABLE if rollout.unavailable is None else rollout.unavailable
    if isinstance(unavailable, int) and rollout.surge >= 1 and replicas >= 1:
        unavailable = min(unavailable, replicas - 1)
    config: dict[str, Any] = {"maxUnavailable": unavailable, "maxSurge": rollout.surge}
    if partition:
        config["partition"] = partition
    return {"type": "RollingUpdate", "rollingUpdateConfiguration": config}


RESTARTS: dict[str, tuple[bool, str]] = {
    "model": (True, "the checkpoint, its revision and features are vLLM arguments"),
    "engine": (True, "the image, vLLM arguments, env and pod resources"),
    "speculativeDecoding": (True, "--speculative-config"),
    "topology": (True, "the group's shape: pods per group, GPUs per pod, each rank's parallel arguments"),
    "scheduling": (True, "node selector, tolerations, priority, scheduler and placement are pod fields"),
    "probes": (True, "the leader's probes and VLLM_ENGINE_READY_TIMEOUT_S"),
    "service.port": (True, "vLLM's --port and the leader's containerPort"),
    "service.apiKeySecret": (True, "VLLM_API_KEY of the API-serving containers"),
    "service.type": (False, "the Service only"),
    "service.annotations": (False, "the Service only"),
    "service.httpRoute": (False, "the HTTPRoute only"),
    "replicas": (False, "the LeaderWorkerSet's spec.replicas: groups are added or removed, none restarted"),
    "autoscaling": (False, "the operator's decisions; they reach the LeaderWorkerSet as replicas"),
    "monitoring": (False, "the PodMonitor only"),
    "disruptionBudget": (False, "the PodDisruptionBudget only"),
    "rollout": (False, "the LeaderWorkerSet's rolloutStrategy, which is not part of its revision"),
    "metadata.labels": (False, "the CR's own labels are not copied to any child"),
    "metadata.annotations": (False, "the CR's own annotations are not copied to any child"),
}
"""What restarts engine groups, declared once: spec field (or CR metadata) -> (whether a change
to it changes the LeaderWorkerSet's ``leaderWorkerTemplate``, hence rolls every group, and why).
Everything under a field shares its row; ``service`` is split because its port and API key are
engine settings. tests/test_rollout_revisions.py changes each field and checks the rendered
templates against this table, and that the table names every field of the spec."""
