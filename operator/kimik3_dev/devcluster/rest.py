"""The dev kit's calls by REST path, over the core's one client (``kimik3.controller.kube.Kube``).

The kit reaches objects the operator's kind registry does not hold (Nodes with their status,
PersistentVolumes, Namespaces, Kueue's cluster-scoped queues, webhooks, RBAC), so it addresses
them by path, e.g. ``/api/v1/nodes`` or
``/apis/leaderworkerset.x-k8s.io/v1/namespaces/ns/leaderworkersets``. Every call is
``Kube.request``: the same transport, timeout and errors (``kimik3.controller.kube.ApiError`` and
its subclasses) as the operator's; objects are the API's JSON (plain dicts). ``Rest.kube`` makes
the kind-addressed calls.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kimik3.controller.kube import Kube, NotFound

__all__ = ["FIELD_MANAGER", "Rest"]

FIELD_MANAGER = "kimik3-devcluster"


class Rest:
    """JSON in, JSON out, by path; a non-2xx answer raises ``ApiError`` (``.status``, ``.message``)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.kube = Kube(api, field_manager=FIELD_MANAGER)

    def call(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
             content_type: str = "application/json") -> Any:
        return self.kube.request(method, path, body, query or (), content_type)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None on 404."""
        try:
            return self.call("GET", path)
        except NotFound:
            return None

    def items(self, path: str, selector: str = "") -> list[dict[str, Any]]:
        """``items`` of a list call, optionally with a label selector."""
        query = [("labelSelector", selector)] if selector else []
        return (self.call("GET", path, query=query) or {}).get("items", [])

    def create(self, path: str, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        query = [("fieldManager", FIELD_MANAGER)] + ([("dryRun", "All")] if dry_run else [])
        return self.call("POST", path, body=obj, query=query)

    def apply(self, path: str, obj: dict[str, Any], force: bool = True,
              field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply ``obj`` at ``path`` (the object's own URL), strict field validation."""
        query = [("fieldManager", field_manager), ("fieldValidation", "Strict")]
        if force:
            query.append(("force", "true"))
        return self.call("PATCH", path, body=obj, query=query,
                         content_type="application/apply-patch+yaml")

    def delete(self, path: str) -> bool:
        """Delete (background propagation); False when already gone."""
        try:
            self.call("DELETE", path, body={"propagationPolicy": "Background"})
            return True
        except NotFound:
            return False
