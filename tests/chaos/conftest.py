"""Fixtures of the fault-injection suite: a control plane of its own (etcd compaction every 10 s
and no watch cache, so a watch resumed from an old resourceVersion gets 410 Gone; an audit log of
the operator's writes), the operator's identity (the chart's ServiceAccount and RBAC, a
TokenRequest token: ``operator_kubeconfig``; the operator under test never runs as admin), helpers
to read the operator's metrics and to wait with a measured time.

Run: ``tools/test tests/chaos -q`` (add ``-s`` to see the measured recovery times); ~3.5 min."""

from __future__ import annotations

import copy
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from kimik3_dev.devcluster.rbac import OperatorIdentity, install_operator_identity

REPO = Path(__file__).resolve().parents[2]
CR = ("inference.kimik3.io/v1alpha1", "KimiK3Deployment")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
COMPACTION_INTERVAL = "10s"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        # Who writes KimiK3Deployments (and their status) and LeaderWorkerSets: the test as admin,
        # the operator as the chart's ServiceAccount. Nothing else is logged (the suite is busy).
        {"level": "Metadata", "verbs": ["create", "patch", "update", "delete"],
         "resources": [{"group": "inference.kimik3.io", "resources": ["kimik3deployments", "kimik3deployments/status"]},
                       {"group": "leaderworkerset.x-k8s.io", "resources": ["leaderworkersets"]}]},
        {"level": "None"},
    ],
}


@pytest.fixture(scope="package")
def chaos_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    state = tmp_path_factory.mktemp("chaos-cp")
    audit = state / "audit"
    audit.mkdir()
    (audit / "policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
    with ControlPlane(state, extra_apiserver_args=[f"--etcd-compaction-interval={COMPACTION_INTERVAL}",
                                                   # watches straight from etcd: a compacted resourceVersion is a 410
                                                   "--watch-cache=false",
                                                   f"--audit-policy-file={audit / 'policy.yaml'}",
                                                   f"--audit-log-path={audit / 'audit.log'}"]) as cp:
        install_apis(cp)
        yield cp


def audit_events(cp: ControlPlane) -> list[dict[str, Any]]:
    """The API server's audit log of ``chaos_cp`` (see ``AUDIT_POLICY``), one dict per request."""
    path = cp.state_dir / "audit" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@pytest.fixture(scope="package")
def chaos_admin(chaos_cp: ControlPlane) -> Iterator[client.ApiClient]:
    with chaos_cp.api_client("admin") as api:
        yield api


@pytest.fixture(scope="package")
def operator_identity(chaos_admin: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> OperatorIdentity:
    """The chart's ServiceAccount and RBAC (``helm template``), installed once; a 24 h token."""
    return install_operator_identity(chaos_admin, tmp_path_factory.mktemp("operator-identity") / "operator.kubeconfig")


@pytest.fixture(scope="package")
def operator_kubeconfig(operator_identity: OperatorIdentity) -> Path:
    """The kubeconfig every operator of this suite runs with: the chart's ServiceAccount token."""
    return operator_identity.kubeconfig


@pytest.fixture
def ckube(chaos_admin: client.ApiClient) -> Kube:
    return Kube(chaos_admin)


@pytest.fixture
def cns(chaos_admin: client.ApiClient) -> Iterator[str]:
    name = f"c-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(chaos_admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except (ApiException, Exception):
        pass


def latency_cr(namespace: str, name: str = "k3-latency", replicas: int | None = None) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml").read_text())
    body = copy.deepcopy(body)
    body["metadata"] = {"name": name, "namespace": namespace}
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    return body


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> tuple[Any, float]:
    """Poll ``fn`` until truthy; returns (value, seconds waited). Exceptions count as not yet."""
    t0 = time.monotonic()
    last: Any = None
    while time.monotonic() - t0 < timeout:
        try:
            last = fn()
        except Exception as exc:  # the API can be down while we poll
            last = exc
        else:
            if last:
                return last, time.monotonic() - t0
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last value {last!r}")


def http_status(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def scrape(health_url: str) -> dict[str, float]:
    """The operator's /metrics as {'name{labels}': value} (samples of all series)."""
    with urllib.request.urlopen(f"{health_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(samples: dict[str, float], key: str) -> float:
    return samples.get(key, 0.0)


def converged(kube: Kube, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
    """The CR's status observed its current generation and the LWS has ``replicas``."""
    obj = kube.get(*CR, namespace, name)
    lws = kube.get(*LWS, namespace, f"{name}-engine")
    if obj is None or lws is None:
        return None
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    if lws["spec"].get("replicas") != replicas:
        return None
    return {"cr": obj, "lws": lws}


def event_reasons(api: client.ApiClient, namespace: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in client.CoreV1Api(api).list_namespaced_event(namespace).items]


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
    path.write_text(yaml.safe_dump(config))
    return path
