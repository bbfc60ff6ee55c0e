"""Plain JSON calls to the dev API server through a ``kubernetes.client.ApiClient``.

The generated client of ``kubernetes`` 37 validates bodies against its models; the dev cluster
sends and reads plain dicts (Node objects with status, server-side apply of third-party kinds),
so it goes one level down, as ``kimik3.controller.kube`` does. ``path`` is the REST path, e.g.
``/api/v1/nodes`` or ``/apis/leaderworkerset.x-k8s.io/v1/namespaces/ns/leaderworkersets``.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kimik3.controller.kube import call_json

__all__ = ["FIELD_MANAGER", "Rest"]

FIELD_MANAGER = "kimik3-devcluster"


class Rest:
    """JSON in, JSON out; non-2xx raises ``ApiException`` (``.status``, ``.body``)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def call(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
             content_type: str = "application/json") -> Any:
        return call_json(self.api, method, path, body, query, content_type)

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None on 404."""
        try:
            return self.call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

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
        return self.call("PATCH", path, body=obj, query=query, content_type="application/apply-patch+yaml")

    def delete(self, path: str) -> bool:
        """Delete (background propagation); False when already gone."""
        try:
            self.call("DELETE", path, body={"propagationPolicy": "Background"})
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
