"""Shared fixtures: one real etcd + kube-apiserver per test session (see kimik3.devcluster)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.devcluster.controlplane import ControlPlane
from kimik3.devcluster.thirdparty import thirdparty_crd_paths

REPO_ROOT = Path(__file__).resolve().parents[1]
OWN_CRDS_DIR = REPO_ROOT / "crds"


def own_crd_files() -> list[Path]:
    """The project's own CRD manifests (``crds/*.yaml``); empty while none are written yet."""
    if not OWN_CRDS_DIR.is_dir():
        return []
    return sorted(p for p in OWN_CRDS_DIR.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane with the third-party CRDs and the project's own CRDs Established."""
    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as cp:
        cp.apply_crds([*thirdparty_crd_paths().values(), *own_crd_files()])
        yield cp


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """ApiClient authenticated as the admin user (group system:masters)."""
    with control_plane.api_client("admin") as api:
        yield api


@pytest.fixture(scope="session")
def operator_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """ApiClient authenticated with the operator's service-account token (only the RBAC you grant)."""
    with control_plane.api_client("operator") as api:
        yield api


@pytest.fixture
def namespace(admin_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (it stays Terminating: no namespace controller runs)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
