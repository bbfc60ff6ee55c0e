"""kube-controller-manager and kube-scheduler 1.35.4 on loopback, run out of cluster.

Both run as the admin identity (``<state>/admin.kubeconfig``), leader election off, serving
``/healthz`` over HTTPS on a free 127.0.0.1 port with a certificate signed by the dev CA (so
the readiness check verifies TLS). The controller-manager gives garbage collection (owner
references), StatefulSets (LeaderWorkerSet groups), namespace deletion, service accounts and
PV/PVC binding; the scheduler places pods (the LeaderWorkerSet webhook's clique affinities are
honoured here). Binaries: ``tools/build-binaries.sh kube-controller-manager kube-scheduler``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kimik3_dev.devcluster.certs import issue_serving_cert
from kimik3_dev.devcluster.controlplane import SERVICE_CLUSTER_IP_RANGE

__all__ = ["ComponentSpec", "controller_manager", "scheduler"]

DISABLED_CONTROLLERS = ("endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller")
"""Controllers the dev controller-manager does not run. Pod IPs here are loopback addresses
(``kimik3_dev.devcluster.podnet``), which the API server refuses in Endpoints and EndpointSlices
("may not be in the loopback range", ``ValidateEndpointIP``): those controllers would only fail
every write and fill the namespaces with warning Events. Nothing here reads EndpointSlices (the
operator does not; no kube-proxy runs): the engine simulator plays the Service from its selector,
its targetPort and the Ready pods it selects (``kimik3_dev.sim.services``)."""
CONTROLLER_MANAGER_QPS = 100
"""API requests/s of the controller-manager (default 20): StatefulSet pods of several groups
are created in one burst; 100/200 keeps a 3-group scale-up under a second here."""


@dataclass(frozen=True)
class ComponentSpec:
    """How to start one component: ``argv``, and the HTTPS URL whose 200 means healthy."""

    name: str
    argv: list[str]
    health_url: str


def _serving_cert(state_dir: Path, name: str) -> tuple[Path, Path]:
    return issue_serving_cert(state_dir / "pki", state_dir / "pki" / name, name)


def controller_manager(state_dir: Path, binary: Path, port: int) -> ComponentSpec:
    """kube-controller-manager 1.35.4 against the dev API server on ``port``."""
    pki = state_dir / "pki"
    cert, key = _serving_cert(state_dir, "kube-controller-manager")
    kubeconfig = state_dir / "admin.kubeconfig"
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--use-service-account-credentials=false",
        "--controllers=" + ",".join(["*", *(f"-{c}" for c in DISABLED_CONTROLLERS)]),
        f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
        f"--kube-api-burst={2 * CONTROLLER_MANAGER_QPS}",
        "--profiling=false",
        "--v=1",
    ]
    return ComponentSpec("kube-controller-manager", argv, f"https://127.0.0.1:{port}/healthz")


def scheduler(state_dir: Path, binary: Path, port: int) -> ComponentSpec:
    """kube-scheduler 1.35.4 (default profile) against the dev API server."""
    cert, key = _serving_cert(state_dir, "kube-scheduler")
    argv = [
        str(binary),
        f"--kubeconfig={state_dir / 'admin.kubeconfig'}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        "--profiling=false",
        "--v=1",
    ]
    return ComponentSpec("kube-scheduler", argv, f"https://127.0.0.1:{port}/healthz")

