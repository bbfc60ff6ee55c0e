"""Applying KimiK3Deployments to the dev cluster, with stand-ins for what a real cluster has.

A recipe whose weights come from a PVC (``spec.model.source.pvc.claimName``, or the claim of a
``cache`` source that the operator does not create) cannot be
scheduled until that claim exists and is bound (kube-scheduler's VolumeBinding refuses the pod).
In the dev cluster nothing mounts volumes (kwok runs no containers), so ``ensure_model_volume``
creates a pre-bound pair: a PersistentVolume ``kimik3-dev-<namespace>-<claim>`` (hostPath
``/var/lib/kimik3-dev/models/<claim>``, never mounted; capacity ``MODEL_VOLUME_SIZE``,
ReadOnlyMany, Retain) and the claim naming it; the controller-manager's PV binder binds them.

A recipe placed by Kueue (``spec.scheduling.placement.mode: kueue``) submits its groups to a
LocalQueue of its namespace: ``ensure_local_queue`` creates it, pointing at the ClusterQueue
``dev up`` made (``kueue.CLUSTER_QUEUE``, every GPU of the cluster), unless it exists.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kimik3.controller.kube import Conflict
from kimik3.kube.kinds import GROUP, KIND, PLURAL, VERSION
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.rest import Rest

__all__ = ["MODEL_VOLUME_SIZE", "apply_deployment", "ensure_local_queue", "ensure_model_volume", "ensure_namespace"]

MODEL_VOLUME_SIZE = "2Ti"
"""Capacity of a stand-in weights volume (the Kimi K3 checkpoint is ~1.5-1.56 TB)."""
BIND_TIMEOUT_S = 30.0
"""Bound on waiting for a stand-in claim to be Bound by the controller-manager, seconds."""
USER_FIELD_MANAGER = "kimik3-dev-user"
"""Field manager of CRs applied by ``kimik3 dev apply`` (not the operator's)."""


def ensure_namespace(rest: Rest, name: str) -> None:
    try:
        rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except Conflict:  # AlreadyExists
        pass


def ensure_model_volume(rest: Rest, namespace: str, claim: str, bind_timeout_s: float = BIND_TIMEOUT_S) -> bool:
    """Create the stand-in PV + PVC for ``namespace/claim`` unless the claim exists, and wait
    (at most ``bind_timeout_s`` s) until it is Bound: a pod created before that is marked
    Unschedulable and retried only after the scheduler's backoff (~10 s measured here).
    Returns True when created."""
    if rest.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}") is not None:
        return False
    pv_name = f"kimik3-dev-{namespace}-{claim}"[:253]
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {"app.kubernetes.io/managed-by": "kimik3-devcluster"}},
        "spec": {
            "capacity": {"storage": MODEL_VOLUME_SIZE},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": f"/var/lib/kimik3-dev/models/{claim}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "kimik3-devcluster"}},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": MODEL_VOLUME_SIZE}}},
    }
    rest.apply(f"/api/v1/persistentvolumes/{pv_name}", pv)
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
    rest.apply(path, pvc)
    deadline = time.monotonic() + bind_timeout_s
    while ((rest.get(path) or {}).get("status") or {}).get("phase") != "Bound":
        if time.monotonic() > deadline:
            raise TimeoutError(f"claim {namespace}/{claim} not Bound within {bind_timeout_s:.0f} s "
                               "(is kube-controller-manager running?)")
        time.sleep(0.2)
    return True


def ensure_local_queue(rest: Rest, namespace: str, name: str,
                       cluster_queue: str = kueue.CLUSTER_QUEUE) -> bool:
    """Create LocalQueue ``namespace/name`` -> ``cluster_queue`` unless it exists. Returns True
    when created."""
    queue = kueue.local_queue(namespace, cluster_queue, name)
    if rest.get(kueue.object_path(queue)) is not None:
        return False
    rest.apply(kueue.object_path(queue), queue)
    return True


def apply_deployment(rest: Rest, cr: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply one KimiK3Deployment (strict validation: a bad spec is refused by the
    API server with its field path), after its namespace and weights volume. Returns the object."""
    meta = cr.setdefault("metadata", {})
    ns = meta.setdefault("namespace", "default")
    ensure_namespace(rest, ns)
    source = (((cr.get("spec") or {}).get("model") or {}).get("source") or {})
    claim = source.get("pvc") or source.get("cache") or {}
    if claim.get("claimName") and not claim.get("create"):
        ensure_model_volume(rest, ns, claim["claimName"])
    placement = (((cr.get("spec") or {}).get("scheduling") or {}).get("placement") or {})
    if placement.get("mode") == "kueue" and placement.get("queueName"):
        ensure_local_queue(rest, ns, placement["queueName"])
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/{meta['name']}"
    return rest.apply(path, cr, force=True, field_manager=USER_FIELD_MANAGER)


def deployments(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The KimiK3Deployment documents among ``docs``."""
    return [d for d in docs if d and d.get("kind") == KIND]
