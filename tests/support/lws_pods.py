"""The pods LeaderWorkerSet (v0.9) makes for one group of a rendered LeaderWorkerSet.

The operator renders the LeaderWorkerSet; the LWS controller and its pod webhook make each
group's pods from it: worker 0 (the leader) from ``leaderTemplate`` (``workerTemplate`` when
there is none), the others from ``workerTemplate``; named ``<lws>-<group>`` and
``<lws>-<group>-<worker>``; labelled with the set's name, the group and worker index; annotated
with the group size; with ``LWS_LEADER_ADDRESS`` (``<lws>-<group>.<lws>.<namespace>``),
``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX`` (from the worker-index label) first in every
container's env. Tests that have no LWS controller create these.
"""

from __future__ import annotations

import copy
from typing import Any

from kimik3.kube.labels import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL

SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"


def group_pods(lws: dict[str, Any], namespace: str, group: int) -> list[dict[str, Any]]:
    """Group ``group``'s pods of the rendered LeaderWorkerSet ``lws``, leader first (module docstring)."""
    name = lws["metadata"]["name"]
    template = lws["spec"]["leaderWorkerTemplate"]
    size = template["size"]
    pods = []
    for worker in range(size):
        source = template.get("leaderTemplate") if worker == 0 else None
        pod = copy.deepcopy(source or template["workerTemplate"])
        meta = pod.setdefault("metadata", {})
        meta["name"] = f"{name}-{group}" + (f"-{worker}" if worker else "")
        meta["namespace"] = namespace
        meta.setdefault("labels", {}).update({LWS_NAME_LABEL: name, LWS_GROUP_INDEX_LABEL: str(group),
                                              LWS_WORKER_INDEX_LABEL: str(worker)})
        meta.setdefault("annotations", {})[SIZE_ANNOTATION] = str(size)
        lws_env = [{"name": "LWS_LEADER_ADDRESS", "value": f"{name}-{group}.{name}.{namespace}"},
                   {"name": "LWS_GROUP_SIZE", "value": str(size)},
                   {"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {
                       "fieldPath": f"metadata.labels['{LWS_WORKER_INDEX_LABEL}']"}}}]
        for c in pod["spec"]["containers"]:
            c["env"] = lws_env + [e for e in c.get("env") or [] if e["name"] not in {v["name"] for v in lws_env}]
            for amounts in ("limits", "requests"):  # quantities, as the API server serves them
                resources = c.get("resources") or {}
                resources[amounts] = {k: str(v) for k, v in (resources.get(amounts) or {}).items()}
        pods.append(pod)
    return pods
