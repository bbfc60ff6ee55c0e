"""What the watches last saw of every child and pod, so a reconcile that changes nothing costs
no API request (a small informer, fed by the kopf event handlers).

- ``update(event)`` stores or drops the object of a watch event (``{"type", "object"}``).
- ``get(api_version, kind, namespace, name)`` returns the last seen body, or None.
- ``owned(api_version, kind, namespace, deployment)`` lists the objects of a kind labelled as a
  deployment's children; ``of_kind(api_version, kind)`` every object of a kind (the
  KimiK3Deployments, fed by their watch);
- ``pods(namespace, deployment)`` lists the pods of a deployment's LeaderWorkerSets seen by the pod watch.
- ``record_apply(obj, desired_hash)`` remembers what the operator applied and the
  resourceVersion the API server returned; ``unchanged(obj, desired_hash)`` is true while the
  watched object still has that resourceVersion and the desired object hashes the same, so the
  apply can be skipped; ``is_echo(body)`` tells an event caused by our own apply.

Correctness rests on the watches: kopf re-lists after a lost watch or a 410 Gone, which refreshes
every entry still there; an object the cache has never seen is simply applied. A re-list tells
nothing about objects deleted meanwhile, so a re-listed owner's applied records are dropped
(``forget_applied``) and its next reconcile applies every child. For the same reason its pods are
marked stale: the next reconcile lists them from the API server once (``pods_stale`` /
``replace_pods``), so a pod deleted while the watch was down does not linger.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from kimik3.kube.kinds import POD
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_NAME_LABEL

Key = tuple[str, str, str, str]
TOMBSTONES = 4096
"""Pod deletions remembered (with their resourceVersion) so a pod list taken just before a
DELETED event cannot bring the deleted pod back."""


def _rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"].get("resourceVersion", "0") or 0)


def object_key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def desired_hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ObjectCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._pods: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._applied: dict[Key, tuple[str, str]] = {}
        self._owned: dict[tuple[str, str], set[Key]] = {}
        self._pods_stale: set[tuple[str, str]] = set()
        self._tombstones: OrderedDict[tuple[str, str], int] = OrderedDict()

    def update(self, event_type: str | None, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        deleted = event_type == "DELETED"
        with self._lock:
            if obj["kind"] == POD.kind:
                pod_labels = obj["metadata"].get("labels") or {}
                deployment = pod_labels.get(DEPLOYMENT_LABEL)
                if deployment and LWS_NAME_LABEL in pod_labels:
                    pods = self._pods.setdefault((key[2], deployment), {})
                    if deleted:
                        pods.pop(key[3], None)
                        self._tombstones[(key[2], key[3])] = _rv(obj)
                        self._tombstones.move_to_end((key[2], key[3]))
                        if len(self._tombstones) > TOMBSTONES:
                            self._tombstones.popitem(last=False)
                    else:
                        pods[key[3]] = obj
                return
            if deleted:
                self._objects.pop(key, None)
                self._applied.pop(key, None)
            else:
                self._objects[key] = obj

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((api_version, kind, namespace, name))

    def of_kind(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind`` the watches saw (all namespaces), e.g. the KimiK3Deployments."""
        with self._lock:
            return [o for (v, k, _, _), o in self._objects.items() if (v, k) == (api_version, kind)]

    def owned(self, api_version: str, kind: str, namespace: str, deployment: str) -> list[dict[str, Any]]:
        """Objects of ``kind`` in ``namespace`` labelled ``inference.kimik3.io/deployment=<deployment>``."""
        with self._lock:
            return [o for (v, k, ns, _), o in self._objects.items() if (v, k, ns) == (api_version, kind, namespace)
                    and ((o["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == deployment)]

    def pods(self, namespace: str, deployment: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.get((namespace, deployment), {}).values())

    def pods_stale(self, namespace: str, owner: str) -> bool:
        """Whether ``owner``'s pods must be listed again (it was re-listed since; see the module)."""
        with self._lock:
            return (namespace, owner) in self._pods_stale

    def replace_pods(self, namespace: str, owner: str, listed: list[dict[str, Any]], list_version: int) -> None:
        """Make the pods of deployment ``owner`` what a list at collection resourceVersion ``list_version``
        returned, keeping any newer watch event: a cached pod missing from the list is dropped only
        when it is older than the list, a listed pod whose deletion was seen later is not added."""
        with self._lock:
            pods = self._pods.setdefault((namespace, owner), {})
            names = {p["metadata"]["name"] for p in listed}
            for name, cached in list(pods.items()):
                if name not in names and _rv(cached) <= list_version:
                    del pods[name]  # deleted while the watch was down
            for pod in listed:
                name = pod["metadata"]["name"]
                if self._tombstones.get((namespace, name), -1) >= _rv(pod):
                    continue
                if name not in pods or _rv(pods[name]) < _rv(pod):
                    pods[name] = pod
            self._pods_stale.discard((namespace, owner))

    def record_apply(self, applied: dict[str, Any], digest: str) -> None:
        key = object_key(applied)
        owners = {r.get("name") for r in applied["metadata"].get("ownerReferences") or []}
        with self._lock:
            self._applied[key] = (digest, applied["metadata"].get("resourceVersion", ""))
            for owner in owners:
                self._owned.setdefault((key[2], owner), set()).add(key)
            current = self._objects.get(key)
            if current is None or _rv(current) <= _rv(applied):
                self._objects[key] = applied

    def forget_applied(self, namespace: str, owner: str) -> None:
        """Stop trusting what was applied for ``owner``'s children: its next reconcile applies them
        for real. Called when the owner is re-listed: after a lost watch or a 410 Gone the re-list
        brings no DELETED event for a child deleted meanwhile, so its entry here would stay and
        its apply would be skipped forever (F6)."""
        with self._lock:
            for key in self._owned.pop((namespace, owner), set()):
                self._applied.pop(key, None)
            self._pods_stale.add((namespace, owner))

    def forget_kind(self, api_version: str, kind: str) -> None:
        """Drop every entry of a kind that was not watched until now (its CRD came after the
        operator): what ``record_apply`` kept of it saw no watch since, so it cannot be trusted."""
        with self._lock:
            for key in [k for k in self._objects if k[:2] == (api_version, kind)]:
                del self._objects[key]
            for key in [k for k in self._applied if k[:2] == (api_version, kind)]:
                del self._applied[key]

    def unchanged(self, desired: dict[str, Any], digest: str) -> bool:
        key = object_key(desired)
        with self._lock:
            recorded = self._applied.get(key)
            live = self._objects.get(key)
        return (recorded is not None and live is not None and recorded[0] == digest
                and live["metadata"].get("resourceVersion") == recorded[1])

    def is_echo(self, obj: dict[str, Any]) -> bool:
        """The event shows exactly the version our last apply produced."""
        with self._lock:
            recorded = self._applied.get(object_key(obj))
        return recorded is not None and recorded[1] == obj["metadata"].get("resourceVersion")
