"""Fixtures of the fault-injection suite: a control plane of its own (etcd compaction every 10 s
and no watch cache, so a watch resumed from an old resourceVersion gets 410 Gone), helpers to
read the operator's metrics and to wait with a measured time.

Run: ``tools/test tests/chaos -q`` (add ``-s`` to see the measured recovery times); ~3.5 min."""

from __future__ import annotations

import copy
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
from kimik3.devcluster.controlplane import ControlPlane
from kimik3.devcluster.install import install_apis

REPO = Path(__file__).resolve().parents[2]
CR = ("inference.kimik3.io/v1alpha1", "KimiK3Deployment")
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
COMPACTION_INTERVAL = "10s"


@pytest.fixture(scope="package")
def chaos_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("chaos-cp"),
                      extra_apiserver_args=[f"--etcd-compaction-interval={COMPACTION_INTERVAL}",
                                            # watches straight from etcd: a compacted resourceVersion is a 410
                                            "--watch-cache=false"]) as cp:
        install_apis(cp)
        yield cp


@pytest.fixture(scope="package")
def chaos_admin(chaos_cp: ControlPlane) -> Iterator[client.ApiClient]:
    with chaos_cp.api_client("admin") as api:
        yield api


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


def proxied_kubeconfig(cp: ControlPlane, port: int, path: Path) -> Path:
    """The admin kubeconfig with the server replaced by the fault proxy's port (the apiserver's
    certificate covers 127.0.0.1, so TLS verification still holds)."""
    config = yaml.safe_load(cp.admin_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path
