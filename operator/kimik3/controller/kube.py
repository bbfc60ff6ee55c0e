"""Kubernetes API access of the operator: server-side apply, get, delete, list, status, events.

One field manager (``kimik3-operator``) owns every field the operator writes. Calls are
synchronous (the official ``kubernetes`` client); the controller runs them in worker threads.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kimik3.kube.kinds import EVENT, kind_of
from kimik3.kube.times import rfc3339

FIELD_MANAGER = "kimik3-operator"
REQUEST_TIMEOUT_S = 30

class NotLeading(Exception):
    """A write refused because this replica does not hold the operator's Lease (leadership.py)."""


class WriteFence(Protocol):
    """Who may write: ``leading()``; ``write_timeout()`` is the client timeout, seconds, a write
    started now may use (it must end before the Lease can pass to another replica), and raises
    ``NotLeading`` when this replica does not lead."""

    def leading(self) -> bool: ...

    def write_timeout(self) -> float: ...


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """REST path of a namespaced object or collection of a kind in ``kimik3.kube.kinds``
    (KeyError for another kind)."""
    return kind_of(api_version, kind).path(namespace, name)


def api_client_from_kubeconfig(path: str | None) -> client.ApiClient:
    """An ApiClient for a kubeconfig file, or the in-cluster service account when ``path`` is None."""
    if path:
        return config.new_client_from_config(config_file=path)
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def call_json(api: client.ApiClient, method: str, path: str, body: Any = None, query: list | None = None,
              content_type: str = "application/json", timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """One REST call with a JSON (or apply-patch) body; the decoded JSON answer, None when empty.
    ``timeout``: the client's connect and read timeout, seconds.
    Goes below the generated client, which would validate plain dicts against its models.
    Non-2xx raises ApiException (``.status``, ``.body``)."""
    request = api.param_serialize(
        method=method, resource_path=path, query_params=query or [],
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body, auth_settings=["BearerToken"])
    response = api.call_api(*request, _request_timeout=timeout)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=(response.data or b"").decode(errors="replace"), data=None)
    return json.loads(response.data) if response.data else None


def is_status_body(exc: ApiException) -> bool:
    """The error's body is a Kubernetes ``Status`` object (any API's own answer), not the API
    server's plain ``404 page not found`` for a path no API serves."""
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("kind") == "Status"


def api_error_message(exc: ApiException, limit: int = 1000) -> str:
    """The ``message`` of the API server's Status body (what kubectl prints), else the raw body;
    at most ``limit`` characters."""
    try:
        body = json.loads(exc.body or "")
        message = body.get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    return (message or exc.body or "")[:limit]


@dataclass
class Kube:
    """Thin typed wrapper over ``ApiClient.call_api`` for the calls the controller makes. With a
    ``fence`` every write (any method but GET) first asks it: a replica that does not lead raises
    ``NotLeading`` instead of writing, and a leader's write times out before its Lease can pass."""

    api: client.ApiClient
    fence: WriteFence | None = None

    def _call(self, method: str, path: str, body: Any = None, query: list | None = None,
              content_type: str = "application/json") -> Any:
        timeout: float = REQUEST_TIMEOUT_S
        if method != "GET" and self.fence is not None:
            timeout = min(timeout, self.fence.write_timeout())
        return call_json(self.api, method, path, body, query, content_type, timeout)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", _path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply ``obj`` as the operator's field manager (strict field validation)."""
        meta = obj["metadata"]
        path = _path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("fieldValidation", "Strict")]
        if force:
            query.append(("force", "true"))
        return self._call("PATCH", path, body=obj, query=query, content_type="application/apply-patch+yaml")

    def delete(self, api_version: str, kind: str, namespace: str, name: str,
               propagation: str = "Background", uid: str = "") -> bool:
        """Delete (only the object of that ``uid`` when given: a 409 Conflict otherwise); False
        when it was already gone."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", _path(api_version, kind, namespace, name), body=body)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def list(self, api_version: str, kind: str, namespace: str, selector: str,
             field_selector: str = "") -> list[dict[str, Any]]:
        """Objects in ``namespace`` (every namespace when "") matching the label ``selector`` (and
        ``field_selector`` when given)."""
        query = [("labelSelector", selector)] + ([("fieldSelector", field_selector)] if field_selector else [])
        out = self._call("GET", _path(api_version, kind, namespace), query=query)
        return out.get("items", [])

    def list_versioned(self, api_version: str, kind: str, namespace: str,
                       selector: str) -> tuple[builtins.list[dict[str, Any]], int]:
        """Items (each with apiVersion and kind set, as a watch delivers them) and the list's
        collection resourceVersion."""
        out = self._call("GET", _path(api_version, kind, namespace), query=[("labelSelector", selector)])
        items = [{"apiVersion": api_version, "kind": kind, **item} for item in out.get("items", [])]
        return items, int((out.get("metadata") or {}).get("resourceVersion", "0") or 0)

    def patch_merge(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        path = _path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event on ``obj`` (Normal or Warning). Never raises: events are best effort
        (a replica that does not lead posts none)."""
        meta = obj["metadata"]
        now = rfc3339()
        body = {
            "apiVersion": EVENT.api_version, "kind": EVENT.kind,
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._call("POST", EVENT.path(meta["namespace"]), body=body)
        except (ApiException, NotLeading):
            pass
