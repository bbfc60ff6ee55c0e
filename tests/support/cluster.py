"""Working against a real API server in tests: a suite's control plane, object references,
namespaces, applying a KimiK3Deployment as a user would and waiting for the operator's status,
events, ``/metrics``."""

from __future__ import annotations

import contextlib
import copy
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kimik3.controller.kube import ApiError, Kube
from kimik3.kube.kinds import COMPUTE_DOMAIN, KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, Kind
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.rendering import launcher_name
from support.waiting import wait_for

CR = KIMIK3_DEPLOYMENT.type_meta
LWS = LEADER_WORKER_SET.type_meta
CD = COMPUTE_DOMAIN.type_meta
"""``(apiVersion, kind)`` of the three kinds most tests address (``Kube.get(*CR, namespace, name)``)."""

API_UNAVAILABLE: tuple[type[BaseException], ...] = (ApiError, ApiException, urllib3.exceptions.HTTPError,
                                                  OSError)
"""What a client call raises while the API server is down, restarting or refusing (a 5xx or
connection error): pass as ``wait_for(..., retry_on=API_UNAVAILABLE)`` across a control-plane fault."""


@contextlib.contextmanager
def serving_control_plane(state_dir: Path, prepare: Callable[[ControlPlane], object],
                          **options: Any) -> Iterator[ControlPlane]:
    """A ``ControlPlane`` started in ``state_dir`` (``options``: its keyword arguments, e.g.
    ``extra_apiserver_args``) with ``prepare(cp)`` done, the APIs a suite needs installed
    (``install_apis``: every CRD and the admission policy); stopped afterwards. The body of each
    suite's control-plane fixture (tests/conftest.py, tests/chaos, tests/chart), whose ``admin_api``
    is then ``cp.api_client("admin")``."""
    with ControlPlane(state_dir, **options) as cp:
        prepare(cp)
        yield cp


def make_namespace(api: client.ApiClient, name: str, labels: dict[str, str] | None = None) -> str:
    """Create namespace ``name`` with ``labels`` unless it exists; return the name (never deleted)."""
    meta = client.V1ObjectMeta(name=name, labels=labels)
    try:
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=meta))
    except ApiException as exc:
        if exc.status != 409:  # AlreadyExists
            raise
    return name


@contextlib.contextmanager
def fresh_namespace(api: client.ApiClient, prefix: str = "t") -> Iterator[str]:
    """A new namespace ``<prefix>-<10 hex>``, deleted afterwards. Without a namespace controller
    (a bare ControlPlane) it stays Terminating; a deletion the API server cannot take (gone after a
    fault test) is let go."""
    name = make_namespace(api, f"{prefix}-{uuid.uuid4().hex[:10]}")
    try:
        yield name
    finally:
        with contextlib.suppress(*API_UNAVAILABLE):
            client.CoreV1Api(api).delete_namespace(name)


def crd_name(kind: Kind) -> str:
    """The name of ``kind``'s CustomResourceDefinition (``<plural>.<group>``)."""
    return f"{kind.plural}.{kind.group}"


def delete_crd(api: client.ApiClient, kind: Kind) -> None:
    """Delete ``kind``'s CRD and wait (30 s at most) until the API server no longer lists it."""
    ext = client.ApiextensionsV1Api(api)
    ext.delete_custom_resource_definition(crd_name(kind))
    wait_for(lambda: crd_name(kind) not in {c.metadata.name for c in ext.list_custom_resource_definition().items}, 30,
             f"{kind.kind} CRD deleted")


@contextlib.contextmanager
def without_crd(cp: ControlPlane, api: client.ApiClient, kind: Kind) -> Iterator[None]:
    """The third-party ``kind``'s CRD deleted (``delete_crd``) for the body; installed again
    afterwards (``thirdparty_crd_paths``) unless the body did, so later tests find it."""
    delete_crd(api, kind)
    yield
    ext = client.ApiextensionsV1Api(api)
    if crd_name(kind) not in {c.metadata.name for c in ext.list_custom_resource_definition().items}:
        cp.apply_crds([thirdparty_crd_paths()[kind.kind]])


def apply(kube: Kube, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """Server-side apply ``body`` (a copy, put in ``namespace`` when given) without force and with
    strict field validation, as ``kubectl apply --server-side`` would; the stored object."""
    body = copy.deepcopy(body)
    if namespace is not None:
        body["metadata"]["namespace"] = namespace
    return kube.apply(body, force=False)


def launcher_configmap(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The launcher ConfigMap the stored spec of KimiK3Deployment ``name`` renders, or None."""
    obj = kube.get(*CR, namespace, name)
    return kube.get("v1", "ConfigMap", namespace, launcher_name(obj)) if obj is not None else None


def reconciled(kube: Kube, namespace: str, name: str, generation: int | None = None,
               timeout: float = 30.0) -> dict[str, Any]:
    """The KimiK3Deployment once its ``status.observedGeneration`` is ``generation`` (default: the
    object's current ``metadata.generation``), waiting at most ``timeout`` seconds."""
    def check() -> dict[str, Any] | None:
        obj = kube.get(*CR, namespace, name)
        if obj is None:
            return None
        want = generation if generation is not None else obj["metadata"]["generation"]
        return obj if (obj.get("status") or {}).get("observedGeneration") == want else None
    return wait_for(check, timeout, f"status of {namespace}/{name} at generation {generation or 'current'}")


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The status condition of ``type_`` of ``obj``; ``{}`` when there is none (or no object yet)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), {})


def events(api: client.ApiClient, namespace: str, reason: str | None = None) -> list[client.CoreV1Event]:
    """The core/v1 Events of ``namespace`` (with ``reason``, when given)."""
    items = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e for e in items if reason is None or e.reason == reason]


def http_status(url: str, timeout: float = 5.0) -> int:
    """The HTTP status of a GET of ``url``; -1 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def metric_samples(base_url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The ``/metrics`` of the server at ``base_url`` (the operator's health port), parsed by
    prometheus_client: ``{(sample name, frozenset of (label, value) pairs): value}``."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and want <= got)
