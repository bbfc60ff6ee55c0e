"""The operator's one client of the Kubernetes API: server-side apply, get, delete, list, status,
events, and ``request`` for any other path; and its errors.

One field manager (``kimik3-operator``) owns every field the operator writes. Calls are
synchronous (the ``kubernetes`` package's ``ApiClient`` carries them: configuration, TLS,
connection pool); the controller runs them in worker threads. Objects go in and come out as
the API's JSON (plain dicts, ``kimik3.kube.objects``), never as the package's models. A refusal
raises ``ApiError`` (a subclass per reason the core tells apart), built from the Kubernetes
``Status`` the API server answers with; the package's own exceptions do not leave this module.
Connection failures (``urllib3`` errors, ``OSError``) are not API answers and pass as they are.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict, cast

from kubernetes import client, config

from kimik3.api.conditions import Event
from kimik3.kube.kinds import EVENT, kind_of
from kimik3.kube.times import rfc3339

FIELD_MANAGER = "kimik3-operator"
REQUEST_TIMEOUT_S = 30
MESSAGE_LIMIT = 1000
"""Characters of an error's message kept (a Status message, or the start of a body that is not one)."""


class NotLeading(Exception):
    """A write refused because this replica does not hold the operator's Lease (leadership.py)."""


class WriteFence(Protocol):
    """Who may write: ``leading()``; ``write_timeout()`` is the client timeout, seconds, a write
    started now may use (it must end before the Lease can pass to another replica), and raises
    ``NotLeading`` when this replica does not lead."""

    def leading(self) -> bool: ...

    def write_timeout(self) -> float: ...


class Status(TypedDict, total=False):
    """The ``Status`` object (meta/v1) the API server answers a refused call with."""

    kind: str
    apiVersion: str
    status: str
    """``"Failure"``."""
    code: int
    reason: str
    """Machine-readable: ``NotFound``, ``AlreadyExists``, ``Conflict``, ``Invalid``, ``Forbidden``..."""
    message: str
    details: dict[str, Any]
    """``name``, ``kind``, ``causes`` (``field``, ``reason``, ``message`` of each)."""


class ApiError(Exception):
    """The API server answered with a status outside 2xx. ``status``: the HTTP code; ``reason``:
    the HTTP reason phrase (``Not Found``); ``message``: the Status body's message (what kubectl
    prints) or the start of the raw body; ``body``: the raw body; ``payload``: the Status body,
    None when the answer is not one (e.g. the API server's ``404 page not found`` for a path no
    API serves)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        self.status, self.reason, self.body = status, reason, body
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        self.payload = cast(Status, decoded) if isinstance(decoded, dict) and decoded.get("kind") == "Status" \
            else None
        self.message: str = ((self.payload or {}).get("message") or body or "")[:MESSAGE_LIMIT]
        super().__init__(f"{status} {reason}: {self.message}")

    @property
    def is_status(self) -> bool:
        """The answer is a Kubernetes ``Status``: some API's own refusal, not a path no API serves."""
        return self.payload is not None


class Forbidden(ApiError):
    """403: RBAC (or an admission policy) refused the caller."""


class NotFound(ApiError):
    """404: no such object, or (``is_status`` False) no API serves the path."""


class Conflict(ApiError):
    """409: already exists, a stale resourceVersion, or a failed uid precondition."""


class Invalid(ApiError):
    """422: the object fails validation (the Status body's ``details.causes`` name the fields)."""


_BY_STATUS: dict[int, type[ApiError]] = {403: Forbidden, 404: NotFound, 409: Conflict, 422: Invalid}


def api_error(status: int, reason: str, body: str) -> ApiError:
    """The ``ApiError`` (subclass) of an answer with HTTP ``status``."""
    return _BY_STATUS.get(status, ApiError)(status, reason, body)


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """REST path of a namespaced object or collection of a kind in ``kimik3.kube.kinds``
    (KeyError for another kind)."""
    return kind_of(api_version, kind).path(namespace, name)


DEFAULT_KUBECONFIG = "~/.kube/config"
"""kubectl's kubeconfig when none is named (``KUBECONFIG`` unset)."""


class NoCluster(Exception):
    """No kubeconfig named, not in a pod, and no ``DEFAULT_KUBECONFIG``, or the named kubeconfig is
    missing or unusable: nothing to talk to."""


def api_client_from_kubeconfig(path: str | None) -> client.ApiClient:
    """An ApiClient for a kubeconfig file; when ``path`` is None, the in-cluster service account
    (in a pod), else kubectl's ``DEFAULT_KUBECONFIG`` when it exists. ``NoCluster``, saying what to
    pass, when there is none of them or the file named is missing or unusable."""
    if path:
        fix = "pass --kubeconfig (or set KUBECONFIG) to a kubeconfig file with a current context"
        if not Path(path).expanduser().is_file():
            raise NoCluster(f"kubeconfig {path}: no such file; {fix}")
        try:
            return cast(client.ApiClient, config.new_client_from_config(config_file=path))
        except (config.ConfigException, OSError) as exc:
            raise NoCluster(f"kubeconfig {path}: {str(exc).rstrip('.')}; {fix}") from None
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        default = Path(DEFAULT_KUBECONFIG).expanduser()
        if default.is_file():
            return cast(client.ApiClient, config.new_client_from_config(config_file=str(default)))
        raise NoCluster(
            f"no cluster to talk to: not in a pod (no in-cluster service account) and no {DEFAULT_KUBECONFIG}; "
            "pass --kubeconfig or set KUBECONFIG") from None
    return client.ApiClient(cfg)


@dataclass
class Kube:
    """The calls the operator makes, over one ``ApiClient``. With a ``fence`` every write (any
    method but GET) first asks it: a replica that does not lead raises ``NotLeading`` instead of
    writing, and a leader's write times out before its Lease can pass. ``field_manager`` owns
    what ``apply`` writes; ``timeout_s`` bounds each call (connect and read, seconds)."""

    api: client.ApiClient
    fence: WriteFence | None = None
    field_manager: str = FIELD_MANAGER
    timeout_s: float = REQUEST_TIMEOUT_S

    def request(self, method: str, path: str, body: Any = None, query: Sequence[tuple[str, str]] = (),
                content_type: str = "application/json") -> Any:
        """One call to ``path`` (e.g. ``/api/v1/nodes``) with a JSON (or patch) body; the decoded
        JSON answer, None when empty. A non-2xx answer raises ``ApiError``. Goes below the
        generated API classes, which would validate plain dicts against their models."""
        timeout = self.timeout_s
        if method != "GET" and self.fence is not None:
            timeout = min(timeout, self.fence.write_timeout())
        request = self.api.param_serialize(
            method=method, resource_path=path, query_params=list(query),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body, auth_settings=["BearerToken"])
        response = self.api.call_api(*request, _request_timeout=timeout)
        data = cast(bytes, response.read()) or b""
        if not 200 <= response.status <= 299:
            raise api_error(response.status, response.reason or "", data.decode(errors="replace"))
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return cast(dict[str, Any], self.request("GET", _path(api_version, kind, namespace, name)))
        except NotFound:
            return None

    def apply(self, obj: dict[str, Any], force: bool = True, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``obj`` as ``field_manager`` (strict field validation). ``dry_run``:
        the API server (admission webhooks included) returns the object as it would store it, and
        stores nothing."""
        meta = obj["metadata"]
        path = _path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", self.field_manager), ("fieldValidation", "Strict")]
        if force:
            query.append(("force", "true"))
        if dry_run:
            query.append(("dryRun", "All"))
        return cast(dict[str, Any], self.request("PATCH", path, body=obj, query=query,
                                                 content_type="application/apply-patch+yaml"))

    def delete(self, api_version: str, kind: str, namespace: str, name: str,
               propagation: str = "Background", uid: str = "") -> bool:
        """Delete (only the object of that ``uid`` when given: a 409 Conflict otherwise); False
        when it was already gone."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", _path(api_version, kind, namespace, name), body=body)
            return True
        except NotFound:
            return False

    def list(self, api_version: str, kind: str, namespace: str, selector: str,
             field_selector: str = "") -> list[dict[str, Any]]:
        """Objects in ``namespace`` (every namespace when "") matching the label ``selector`` (and
        ``field_selector`` when given)."""
        query = [("labelSelector", selector)] + ([("fieldSelector", field_selector)] if field_selector else [])
        out = self.request("GET", _path(api_version, kind, namespace), query=query)
        return cast(list[dict[str, Any]], out.get("items", []))

    def list_versioned(self, api_version: str, kind: str, namespace: str,
                       selector: str) -> tuple[builtins.list[dict[str, Any]], int]:
        """Items (each with apiVersion and kind set, as a watch delivers them) and the list's
        collection resourceVersion."""
        out = self.request("GET", _path(api_version, kind, namespace), query=[("labelSelector", selector)])
        items = [{"apiVersion": api_version, "kind": kind, **item} for item in out.get("items", [])]
        return items, int((out.get("metadata") or {}).get("resourceVersion", "0") or 0)

    def patch_merge(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any],
                    subresource: str | None = None) -> dict[str, Any]:
        path = _path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return cast(dict[str, Any], self.request("PATCH", path, body=patch, content_type="application/merge-patch+json"))

    def event(self, obj: dict[str, Any], event: Event) -> None:
        """Record ``event`` (a core/v1 Event) on ``obj``. Never raises: events are best effort (a
        replica that does not lead posts none)."""
        meta = obj["metadata"]
        now = rfc3339()
        body = {
            "apiVersion": EVENT.api_version, "kind": EVENT.kind,
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.request("POST", EVENT.path(meta["namespace"]), body=body)
        except (ApiError, NotLeading):
            pass
