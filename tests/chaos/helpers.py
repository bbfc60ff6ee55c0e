"""What the fault-injection tests check, beyond the shared helpers of tests/support: who wrote
what (the audit log of ``chaos_cp``), when a CR has converged, a kubeconfig through the fault proxy,
the trays' DRA ResourceSlices (this control plane runs no DRA driver)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kimik3.api.documents import dump_yaml
from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.dradriver import resource_slice
from kimik3_dev.devcluster.operator_thread import OperatorThread
from kimik3_dev.devcluster.rbac import OperatorIdentity
from kimik3.render.meta import engine_set_name
from support.cluster import CR, LWS
from support.recipes import recipe
from support.waiting import wait_for


def audit_events(cp: ControlPlane) -> list[dict[str, Any]]:
    """The API server's audit log of ``chaos_cp`` (see ``AUDIT_POLICY``), one dict per request."""
    path = cp.state_dir / "audit" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def converged(kube: Kube, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
    """``{"cr": ..., "lws": ...}`` once the CR's status observed its current generation and the LWS
    has ``replicas``; None before."""
    obj = kube.get(*CR, namespace, name)
    lws = kube.get(*LWS, namespace, engine_set_name(name))
    if obj is None or lws is None:
        return None
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    if lws["spec"].get("replicas") != replicas:
        return None
    return {"cr": obj, "lws": lws}


def operator_in(identity: OperatorIdentity, namespace: str) -> OperatorThread:
    """The operator (not started; a context manager) watching ``namespace`` with ``identity``'s token."""
    return OperatorThread(str(identity.kubeconfig), namespaces=[namespace])


def apply_converged(kube: Kube, namespace: str, name: str, replicas: int = 1, timeout: float = 30.0) -> dict[str, Any]:
    """Apply the latency recipe as ``name`` with ``replicas`` (as admin, server-side) and return
    ``converged`` once it is, waiting at most ``timeout`` seconds."""
    kube.apply(recipe(namespace=namespace, name=name, replicas=replicas), force=False)
    return wait_for(lambda: converged(kube, namespace, name, replicas), timeout, f"{name} reconciled")


@contextlib.contextmanager
def trays_publishing(api: client.ApiClient, *nodes: str) -> Iterator[None]:
    """The ResourceSlice of NVIDIA's ComputeDomain kubelet plugin on each of ``nodes``, as the
    driver publishes it on every tray where it runs (``dradriver.resource_slice``), for the
    duration of the block (cluster-scoped: deleted after it, so tests of the package do not share
    them). Without them every tray of an engine pod is ``ResourceSliceMissing``."""
    resource = client.ResourceV1Api(api)
    slices = [resource_slice(n) for n in nodes]
    for body in slices:
        resource.create_resource_slice(body)
    try:
        yield
    finally:
        for body in slices:
            resource.delete_resource_slice(body["metadata"]["name"])


def writers(cp: ControlPlane, namespace: str) -> dict[str, dict[str, set[str]]]:
    """Who wrote what in ``namespace``, from the audit log: ``{"leaderworkersets" |
    "kimik3deployments" | "kimik3deployments/status": {username: {user uid, ...}}}`` over every
    completed create/patch/update/delete (successful or not)."""
    out: dict[str, dict[str, set[str]]] = {}
    for event in audit_events(cp):
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or ref.get("namespace") != namespace:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        user = event["user"]
        out.setdefault(resource, {}).setdefault(user["username"], set()).add(user.get("uid", ""))
    return out


def assert_operator_wrote_as(identity: OperatorIdentity, cp: ControlPlane, namespace: str) -> None:
    """Every LeaderWorkerSet write in ``namespace`` was the operator's, made with ``identity``'s
    token (the chart's ServiceAccount: its user and the ServiceAccount object's UID, not the static
    token of ControlPlane's operator.kubeconfig); it also wrote the CRs (finalizer) and their status."""
    seen = writers(cp, namespace)
    operator = {identity.user: {identity.uid}}
    assert seen.get("leaderworkersets") == operator, seen
    assert seen.get("kimik3deployments/status", {}).get(identity.user) == {identity.uid}, seen
    assert seen.get("kimik3deployments", {}).get(identity.user) == {identity.uid}, seen


def proxied_kubeconfig(kubeconfig: Path, port: int, path: Path) -> Path:
    """``kubeconfig`` (the operator's token one) with the server replaced by the fault proxy's port
    (the apiserver's certificate covers 127.0.0.1, so TLS verification still holds)."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(dump_yaml(config))
    return path
