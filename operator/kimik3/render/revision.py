"""Revisions of the engine groups: what restarts them, and the hash that tells a template change.

LeaderWorkerSet v0.9.0 (``pkg/controllers/leaderworkerset_controller.go``) rolls its groups
whenever ``spec.leaderWorkerTemplate`` changes, keeping them all in one leader StatefulSet, so a
surge group can never take an old group's place. The operator never changes the templates of a
live LeaderWorkerSet: a change of them creates a new one beside the old (``controller.fleet``),
told by ``template_hash``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kimik3.kube.kinds import GROUP

TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-hash"
"""On the LeaderWorkerSet (not in its templates, so it restarts nothing): ``template_hash`` of the
templates the operator rendered, so a template change is told from a replica change."""


def template_hash(template: dict[str, Any]) -> str:
    """A short hash of a rendered ``leaderWorkerTemplate`` (12 hex digits of SHA-256 of its JSON)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


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
    "rollout": (False, "how the operator moves groups from the old LeaderWorkerSet to the new one"),
    "routing": (False, "the InferencePool, the endpoint picker and the HTTPRoute's backend: pods are selected, not changed"),
    "idle": (False, "the operator's stop and wake; they reach the LeaderWorkerSet as replicas"),
    "metadata.labels": (False, "the CR's own labels are not copied to any child"),
    "metadata.annotations": (False, "the CR's own annotations are not copied to any child"),
}
"""What restarts engine groups, declared once: spec field (or CR metadata) -> (whether a change
to it changes the LeaderWorkerSet's ``leaderWorkerTemplate``, hence rolls every group, and why).
Everything under a field shares its row; ``service`` is split because its port and API key are
engine settings. tests/test_rollout_revisions.py changes each field and checks the rendered
templates against this table, and that the table names every field of the spec."""
