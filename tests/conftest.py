"""Shared fixtures: one real etcd + kube-apiserver per test session (see kimik3_dev.devcluster)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.install import install_apis
from kimik3_dev.devcluster.operator_thread import OperatorThread


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane with the third-party CRDs, the project's own CRDs Established and
    its admission policy installed (``crds/``)."""
    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as cp:
        install_apis(cp)
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


@pytest.fixture(scope="session")
def operator(control_plane: ControlPlane) -> Iterator[OperatorThread]:
    """The operator (kopf, cluster-wide, admin identity) running in a thread for the session."""
    with OperatorThread(str(control_plane.admin_kubeconfig)) as op:
        yield op


@pytest.fixture(scope="session")
def kube(admin_api: client.ApiClient) -> Kube:
    """The operator's own API wrapper, as admin."""
    return Kube(admin_api)
